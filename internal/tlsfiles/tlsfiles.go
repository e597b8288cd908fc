// Package tlsfiles builds the TLS configurations of this module's commands
// from PEM files: a client's (to Redis, to a gRPC server) and a server's,
// both of which take renewed certificates and authorities without a
// restart.
//
// A server's files are read at every handshake, a client source's at every
// new connection: when one of them changed (a renewal written in place, a
// Kubernetes Secret's symlink swap), they are parsed again, and the
// connection gets the new certificate at once. A set that does not load (a
// half-written renewal, a key that does not match the certificate) leaves
// the last good one in use, is reported once, and is tried again when the
// files change again. Connections already open keep their session: TLS
// certificates are checked at the handshake.
package tlsfiles

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/flagvalue"
)

// ClientFiles configure a client's TLS.
type ClientFiles struct {
	// CA, when set, is a PEM file of the authorities that may sign the
	// server's certificate, in place of the system's roots.
	CA string
	// Cert and Key, set together, are a PEM client certificate and its key,
	// for servers that ask for one (mutual TLS).
	Cert, Key string
	// ServerName, when set, is the name verified in the server's
	// certificate instead of the host dialled.
	ServerName string
	// Insecure skips the verification of the server's certificate.
	Insecure bool
}

// Register registers the flags that set f on fs: prefix followed by ca,
// cert, key, server-name and insecure-skip-verify. peer names the server in
// their help ("Redis").
func (f *ClientFiles) Register(fs *flag.FlagSet, prefix, peer string) {
	fs.StringVar(&f.CA, prefix+"ca", "", fmt.Sprintf("PEM file of the authorities that sign the %s certificate, in place of the system's (enables TLS)", peer))
	fs.StringVar(&f.Cert, prefix+"cert", "", fmt.Sprintf("PEM client certificate for mutual TLS, for a %s that asks for one (with --%skey; enables TLS)", peer, prefix))
	fs.StringVar(&f.Key, prefix+"key", "", fmt.Sprintf("PEM key of --%scert", prefix))
	fs.StringVar(&f.ServerName, prefix+"server-name", "", fmt.Sprintf("name to verify in the %s certificate (default: the host dialled; enables TLS)", peer))
	fs.BoolVar(&f.Insecure, prefix+"insecure-skip-verify", false, fmt.Sprintf("do not verify the %s certificate (testing only; enables TLS)", peer))
}

// Set reports whether any of f is set: the client then speaks TLS.
func (f ClientFiles) Set() bool {
	return f != ClientFiles{}
}

// ClientFlags are a client command's TLS flags: --tls, which turns TLS on
// with the system's authorities, and --tls.ca, --tls.cert... (Register),
// any of which turns it on too.
type ClientFlags struct {
	On    bool
	Files ClientFiles
}

// Register registers the flags on fs; peer names the server in their help.
func (f *ClientFlags) Register(fs *flag.FlagSet, peer string) {
	fs.BoolVar(&f.On, "tls", false, fmt.Sprintf("speak TLS to the %s, trusting the system's authorities unless --tls.ca is set (any --tls.* flag implies it)", peer))
	f.Files.Register(fs, "tls.", peer)
}

// Config returns the configuration of the flags, or nil when they leave
// TLS off. An error names the flags.
func (f *ClientFlags) Config() (*tls.Config, error) {
	if !f.On && !f.Files.Set() {
		return nil, nil
	}
	cfg, err := Client(f.Files)
	if err != nil {
		return nil, fmt.Errorf("--tls.*: %w", err)
	}
	return cfg, nil
}

// Client builds a client's configuration (TLS 1.2 or later) from f's files
// as they are now, for a client that connects once or for a short while
// (NewClientSource reads renewed files for each new connection).
//
// Its files are read once, and may be anything that reads (a shell's
// <(command), a named pipe); the sources that read them again take regular
// files only.
func Client(f ClientFiles) (*tls.Config, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	cfg, _, err := f.build(readFiles(f.files(), 0, os.ReadFile))
	return cfg, err
}

// ClientSource is a client's TLS configuration whose files are read again
// for each new connection: a renewed client certificate, or new
// authorities, are used from the next connection on, without a restart.
// Create it with NewClientSource; it is safe for concurrent use.
type ClientSource struct{ w *watched }

// NewClientSource reads f's files (an error names the file and the reason).
// onLoad, when not nil, is called with every load, the first included, and
// every failed one: from the goroutine that asked for a configuration, while
// no other can change it, so keep it short.
func NewClientSource(f ClientFiles, onLoad func(Loaded)) (*ClientSource, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	w, err := newWatched(f.files(), f.build, onLoad)
	if err != nil {
		return nil, err
	}
	return &ClientSource{w: w}, nil
}

// Config returns the configuration for a new connection, after reading the
// files (a few kilobytes; parsed again only when they changed). A set that
// does not load leaves the last good one in use. It is safe to call from
// many goroutines at once; the configuration returned is shared, and must
// not be modified (Clone it).
func (c *ClientSource) Config() *tls.Config { return c.w.current() }

// Check reads the files now, as a new connection would, so that a change
// is loaded and reported without waiting for one.
func (c *ClientSource) Check() { c.w.current() }

func (f ClientFiles) check() error {
	if (f.Cert == "") != (f.Key == "") {
		return errors.New("a client certificate needs both the certificate and the key file")
	}
	return nil
}

func (f ClientFiles) files() fileSet { return fileSet{cert: f.Cert, key: f.Key, ca: f.CA} }

// build makes a client's configuration of c, f's files.
func (f ClientFiles) build(c contents) (*tls.Config, *x509.Certificate, error) {
	if c.err != nil {
		return nil, nil, c.err
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         f.ServerName,
		InsecureSkipVerify: f.Insecure, //nolint:gosec // the operator's explicit choice
	}
	if f.CA != "" {
		pool, err := certPool(c.ca, "authorities", f.CA)
		if err != nil {
			return nil, nil, err
		}
		cfg.RootCAs = pool
	}
	var leaf *x509.Certificate
	if f.Cert != "" {
		cert, err := keyPair(c, f.Cert, f.Key)
		if err != nil {
			return nil, nil, err
		}
		cfg.Certificates, leaf = []tls.Certificate{cert}, cert.Leaf
	}
	return cfg, leaf, nil
}

// ServerFiles configure a server's TLS.
type ServerFiles struct {
	// Cert and Key are the server's PEM certificate (with its chain) and
	// key. Both are required.
	Cert, Key string
	// ClientCA, when set, is a PEM file of the authorities that sign client
	// certificates: a client must then present one they signed (mutual
	// TLS).
	ClientCA string
	// ClientSANs, when set (with ClientCA), are the names a client
	// certificate may carry: it must name at least one of them, as a host
	// name or IP address it is valid for (checked as a server's would be:
	// a wildcard name in the certificate, *.edge.internal, covers one
	// label, gw-1.edge.internal), or as one of its URIs (a SPIFFE ID) or
	// e-mail addresses.
	ClientSANs []string
}

// Register registers on fs the flags that set f: prefix followed by cert,
// key, client-ca and client-san.
func (f *ServerFiles) Register(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&f.Cert, prefix+"cert", "", fmt.Sprintf("PEM certificate (with its chain) to serve TLS with (with --%skey); renewed files are read at the next handshake", prefix))
	fs.StringVar(&f.Key, prefix+"key", "", fmt.Sprintf("PEM key of --%scert", prefix))
	fs.StringVar(&f.ClientCA, prefix+"client-ca", "", fmt.Sprintf("PEM file of the authorities that sign client certificates: every client must present one (mutual TLS; needs --%scert)", prefix))
	fs.Var((*flagvalue.List)(&f.ClientSANs), prefix+"client-san", fmt.Sprintf("names a client certificate must carry one of, comma-separated or repeated: host names or IP addresses it is valid for (a wildcard name in the certificate, *.edge.internal, covers gw-1.edge.internal), URIs (a SPIFFE ID) or e-mail addresses, each compared with the certificate's names of its type (needs --%sclient-ca)", prefix))
}

// CheckFlags refuses a partial setting of the flags Register registered
// with prefix, naming them.
func (f ServerFiles) CheckFlags(prefix string) error {
	switch {
	case (f.Cert == "") != (f.Key == ""):
		return fmt.Errorf("--%[1]scert and --%[1]skey go together: set both to serve TLS, or neither", prefix)
	case f.ClientCA != "" && f.Cert == "":
		return fmt.Errorf("--%[1]sclient-ca is set, but TLS is off: set --%[1]scert and --%[1]skey", prefix)
	case len(f.ClientSANs) > 0 && f.ClientCA == "":
		return fmt.Errorf("--%[1]sclient-san is set, but no --%[1]sclient-ca: client names are checked only in certificates an authority verified", prefix)
	}
	return nil
}

// Loaded describes one load of a server's or a client source's files, for
// logs and metrics.
type Loaded struct {
	// Initial is true for the load at construction.
	Initial bool
	// Restored is true when, after a set that failed to load, the files
	// hold the set in use again (a bad edit reverted): nothing was loaded,
	// and the failure is over.
	Restored bool
	// Err is why the files did not load (the previous ones stay in use).
	Err error
	// Subject and NotAfter describe the certificate now served, or
	// presented by a client (after a failure, the previous one); empty for
	// a client without a certificate.
	Subject  string
	NotAfter time.Time
}

// Server is a server's TLS configuration whose files are read again when
// they change. Create it with NewServer; it is safe for concurrent use.
type Server struct{ w *watched }

// NewServer reads f's files (an error names the file and the reason) and
// returns the server's configuration. onLoad, when not nil, is called with
// every load, the first included, while no handshake can change the
// configuration: keep it short.
func NewServer(f ServerFiles, onLoad func(Loaded)) (*Server, error) {
	switch {
	case f.Cert == "" || f.Key == "":
		return nil, errors.New("a server certificate needs both the certificate and the key file")
	case len(f.ClientSANs) > 0 && f.ClientCA == "":
		return nil, errors.New("client names to accept are set, but no authority for client certificates")
	}
	w, err := newWatched(fileSet{cert: f.Cert, key: f.Key, ca: f.ClientCA}, f.build, onLoad)
	if err != nil {
		return nil, err
	}
	return &Server{w: w}, nil
}

// Config returns the configuration to give gRPC's credentials.NewTLS (which
// adds HTTP/2's ALPN name to what each handshake gets): each handshake takes
// the files' current certificate, authorities and names.
func (s *Server) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.w.current(), nil
		},
	}
}

// Check reads the files now, as a handshake would, so that a change is
// loaded and reported without waiting for a new connection.
func (s *Server) Check() { s.w.current() }

// build makes a server's configuration of c, f's files.
func (f ServerFiles) build(c contents) (*tls.Config, *x509.Certificate, error) {
	if c.err != nil {
		return nil, nil, c.err
	}
	cert, err := keyPair(c, f.Cert, f.Key)
	if err != nil {
		return nil, nil, err
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
	}
	if f.ClientCA != "" {
		pool, err := certPool(c.ca, "client authorities", f.ClientCA)
		if err != nil {
			return nil, nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		if len(f.ClientSANs) > 0 {
			cfg.VerifyConnection = verifyClientNames(f.ClientSANs)
		}
	}
	return cfg, cert.Leaf, nil
}

// fileSet names the files of one configuration: a certificate and its key,
// and authorities; any may be empty.
type fileSet struct{ cert, key, ca string }

// watched is a TLS configuration built from files and built again when
// they change: a server's, whose every handshake asks for it, or a
// client's, asked for at each new connection. The files are read at each
// request. A set that does not load (a half-written renewal, a key that
// does not match the certificate) leaves the last good one in use, is
// reported once, and is tried again when the files change again.
type watched struct {
	files  fileSet
	build  func(contents) (*tls.Config, *x509.Certificate, error)
	onLoad func(Loaded)
	reads  atomic.Uint64 // numbers each read of the files
	// readFile reads one file: readRegular, or a test's.
	readFile func(string) ([]byte, error)

	mu       sync.Mutex
	cfg      *tls.Config // in use; never nil
	leaf     *x509.Certificate
	stamp    string // the files' stamp when cfg was read
	badStamp string // the stamp of the last set that failed to load
	applied  uint64 // the number of the last read applied
}

// newWatched reads and builds the files a first time; an error names the
// file and the reason.
func newWatched(files fileSet, build func(contents) (*tls.Config, *x509.Certificate, error), onLoad func(Loaded)) (*watched, error) {
	w := &watched{files: files, build: build, onLoad: onLoad, readFile: readRegular}
	c := w.read()
	cfg, leaf, err := build(c)
	if err != nil {
		return nil, err
	}
	w.cfg, w.leaf, w.stamp, w.applied = cfg, leaf, c.stamp, c.n
	w.report(Loaded{Initial: true})
	return w, nil
}

// current reads the files and, when they changed, builds them, all outside
// the lock, so that a slow read holds up its own handshake only; the lock
// guards the comparison and the swap.
func (w *watched) current() *tls.Config {
	c := w.read()
	w.mu.Lock()
	if c.stamp == w.stamp || c.stamp == w.badStamp {
		if c.stamp == w.stamp && w.badStamp != "" && c.n > w.applied {
			w.badStamp, w.applied = "", c.n
			w.report(Loaded{Restored: true})
		}
		cfg := w.cfg
		w.mu.Unlock()
		return cfg
	}
	w.mu.Unlock()

	cfg, leaf, err := w.build(c)
	if err != nil {
		// A renewal read between its certificate and its key (two
		// files, two reads) is whole a moment later: read once more
		// before calling it a failure.
		if again := w.read(); again.stamp != c.stamp {
			c = again
			cfg, leaf, err = w.build(c)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if c.n <= w.applied {
		// A later read was applied while this one was built.
		return w.cfg
	}
	if c.stamp == w.badStamp || (c.stamp == w.stamp && w.badStamp == "") {
		// An earlier read of the same files was applied (and reported)
		// while this one was built: handshakes that overlap a renewal
		// report it once.
		w.applied = c.n
		return w.cfg
	}
	w.applied = c.n
	if err != nil {
		w.badStamp = c.stamp
	} else {
		w.cfg, w.leaf, w.stamp, w.badStamp = cfg, leaf, c.stamp, ""
	}
	w.report(Loaded{Err: err})
	return w.cfg
}

// report tells onLoad of l, with the certificate in use; w.mu is held (or
// w is not yet shared).
func (w *watched) report(l Loaded) {
	if w.onLoad == nil {
		return
	}
	if w.leaf != nil {
		l.Subject, l.NotAfter = w.leaf.Subject.String(), w.leaf.NotAfter
	}
	w.onLoad(l)
}

// contents are the files of a configuration as read at one instant.
type contents struct {
	n             uint64 // the read's number: later reads have larger ones
	cert, key, ca []byte
	err           error // the first file that could not be read
	// stamp identifies the contents: a hash of each file, or why it could
	// not be read. Reading a few kilobytes at a handshake costs far less
	// than the handshake's own cryptography and, unlike a file's size and
	// modification time (whose clock ticks every few milliseconds), no
	// change goes unseen.
	stamp string
}

func (w *watched) read() contents {
	return readFiles(w.files, w.reads.Add(1), w.readFile)
}

// readFiles reads files with readFile, as the read numbered n.
func readFiles(files fileSet, n uint64, readFile func(string) ([]byte, error)) contents {
	c := contents{n: n}
	var b strings.Builder
	for _, f := range []struct {
		role, name string
		dst        *[]byte
	}{{"certificate", files.cert, &c.cert}, {"key", files.key, &c.key}, {"authorities", files.ca, &c.ca}} {
		if f.name == "" {
			continue
		}
		data, err := readFile(f.name)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v;", f.name, err)
			if c.err == nil {
				c.err = fmt.Errorf("%s: %w", f.role, err)
			}
			continue
		}
		*f.dst = data
		fmt.Fprintf(&b, "%s %x;", f.name, sha256.Sum256(data))
	}
	c.stamp = b.String()
	return c
}

// readRegular reads a regular file (through symbolic links). Anything else
// is refused: a named pipe would block the handshake, and a /dev/fd path
// reads differently every time.
func readRegular(name string) ([]byte, error) {
	fi, err := os.Stat(name)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%v)", name, fi.Mode().Type())
	}
	return os.ReadFile(name)
}

// keyPair parses c's certificate and key, read from certFile and keyFile
// (which name them in an error), with the leaf certificate parsed.
func keyPair(c contents, certFile, keyFile string) (tls.Certificate, error) {
	cert, err := tls.X509KeyPair(c.cert, c.key)
	if err != nil {
		return cert, fmt.Errorf("certificate %s with key %s: %w", certFile, keyFile, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return cert, fmt.Errorf("certificate %s: %w", certFile, err)
		}
	}
	return cert, nil
}

// verifyClientNames accepts a connection whose (verified) client
// certificate names one of names, each compared with the SANs of its own
// type only: a URI (a name with a scheme, spiffe://… or urn:…) with the
// certificate's URIs as written, an e-mail address (a name with an @) with
// its e-mail addresses as written, and any other name as a host name or IP
// address the certificate is valid for (as a server's would be checked, so
// that a wildcard DNS name covers its subdomains, as envoyproxy/ratelimit's
// GRPC_CLIENT_TLS_SAN does). Compared with every type, a name matched a SAN
// of another type that held the same text (a SPIFFE ID written as a DNS
// name, in any case).
func verifyClientNames(names []string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("no client certificate")
		}
		c := cs.PeerCertificates[0]
		for _, n := range names {
			var ok bool
			switch {
			case net.ParseIP(n) == nil && strings.Contains(n, ":"):
				ok = slices.ContainsFunc(c.URIs, func(u *url.URL) bool { return u.String() == n })
			case strings.Contains(n, "@"):
				ok = slices.Contains(c.EmailAddresses, n)
			default:
				ok = c.VerifyHostname(n) == nil
			}
			if ok {
				return nil
			}
		}
		return &ClientNameError{Accepted: names, Names: SANs(c)}
	}
}

// ClientNameError refuses a client whose verified certificate names none of
// the names accepted (--grpc.tls.client-san): the handshake fails with it.
type ClientNameError struct {
	Accepted []string // the names accepted
	Names    []string // the certificate's names (SANs)
}

func (e *ClientNameError) Error() string {
	return fmt.Sprintf("client certificate names none of %s (it names %s)", strings.Join(e.Accepted, ", "), strings.Join(e.Names, ", "))
}

// SANs lists the subject alternative names of c: DNS names, URIs, IP
// addresses and e-mail addresses, each as written in a certificate request.
func SANs(c *x509.Certificate) []string {
	var out []string
	out = append(out, c.DNSNames...)
	for _, u := range c.URIs {
		out = append(out, u.String())
	}
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	return append(out, c.EmailAddresses...)
}

// certPool parses the authorities read from file; what names them in an
// error.
func certPool(pem []byte, what, file string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s %s: no PEM certificate found", what, file)
	}
	return pool, nil
}
