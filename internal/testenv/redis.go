package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	redisInstallHint = "run `make test` (it installs Debian's redis-server, redis-sentinel and redis-tools)"

	// readyTimeout bounds how long a started server may take to answer PING.
	// The machines running the suite are shared and slow under -race, so it is
	// generous; a healthy redis-server answers within milliseconds.
	readyTimeout = 30 * time.Second
	// stopTimeout bounds how long Stop waits after SIGTERM before SIGKILL.
	stopTimeout = 15 * time.Second
	// pollInterval is the pause between two readiness probes.
	pollInterval = 10 * time.Millisecond
	// startAttempts is how often a new server is retried on a fresh port when
	// the chosen port was taken by someone else in the meantime.
	startAttempts = 5
	// logTail is how much of a server log is printed when a test fails.
	logTail = 64 << 10
)

// errPortInUse reports that a server could not bind its port.
var errPortInUse = errors.New("port already in use")

// RedisOption configures RedisServer.
type RedisOption func(*redisConfig)

type redisConfig struct {
	args       []string
	password   string
	socket     bool
	tls        *TLSFiles // nil: a new authority's, made at start (WithTLS)
	withTLS    bool
	clientAuth bool
}

// WithArgs appends extra command-line arguments to redis-server, for example
// WithArgs("--maxmemory", "1mb"). They come after the defaults and so override
// them.
func WithArgs(args ...string) RedisOption {
	return func(c *redisConfig) { c.args = append(c.args, args...) }
}

// WithPassword starts redis-server with --requirepass and makes Client
// authenticate with it.
func WithPassword(password string) RedisOption {
	return func(c *redisConfig) {
		c.password = password
		c.args = append(c.args, "--requirepass", password)
	}
}

// WithUnixSocket makes redis-server listen on a Unix socket as well as on its
// TCP port; Redis.Socket is its path.
func WithUnixSocket() RedisOption {
	return func(c *redisConfig) { c.socket = true }
}

// WithTLS makes redis-server serve TLS on a second port (Redis.TLSAddr)
// as well as plain TCP on its Addr, which the helpers' own client uses, with
// certificates of a new authority (Redis.TLS). With clientAuth a client
// must present a certificate signed by it (Redis's tls-auth-clients yes).
func WithTLS(clientAuth bool) RedisOption {
	return func(c *redisConfig) { c.withTLS, c.clientAuth = true, clientAuth }
}

// withTLSFiles is WithTLS with the certificates f, which other servers of
// a setup share.
func withTLSFiles(f *TLSFiles, clientAuth bool) RedisOption {
	return func(c *redisConfig) { c.tls, c.clientAuth = f, clientAuth }
}

// WithReplicaOf starts redis-server as a replica of the server at addr
// ("host:port").
func WithReplicaOf(addr string) RedisOption {
	return func(c *redisConfig) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			host, port = addr, ""
		}
		c.args = append(c.args, "--replicaof", host, port)
	}
}

// Redis is one redis-server process (also used for Cluster nodes and for the
// Sentinel processes of a Sentinel setup). Its methods are safe for
// concurrent use, but those that fail the test must run on the test goroutine.
type Redis struct {
	// Addr is "127.0.0.1:<Port>". It stays the same across Stop/Start.
	Addr string
	// Port is the TCP port the server listens on.
	Port int
	// Socket is the path of the server's Unix socket, "" unless started
	// WithUnixSocket.
	Socket string
	// TLSAddr is where the server serves TLS with the certificates TLS;
	// both are unset (empty, nil) unless it was started WithTLS (or in a
	// Cluster WithClusterTLS, or a Sentinel setup WithSentinelTLS).
	TLSAddr string
	TLS     *TLSFiles

	t        testing.TB
	name     string
	bin      string
	args     []string
	password string
	dir      string
	logPath  string

	mu     sync.Mutex
	proc   *process
	paused bool
	client *redis.Client
}

// process is one running OS process and the signal of its exit.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait returned
}

// nodeSpec describes how to start one redis-server process.
type nodeSpec struct {
	name     string
	bin      string
	password string
	// args returns the full argument list for a server on port, with dir as its
	// working and data directory. It is called again for every attempt.
	args func(port int, dir string) ([]string, error)
	// tls, when set, makes the server serve TLS with these certificates on
	// a second free port as well, asking clients for a certificate when
	// clientAuth is set.
	tls        *TLSFiles
	clientAuth bool
}

// RedisServer starts a standalone redis-server on a free loopback port with
// persistence disabled (--save "" --appendonly no) and a temporary working
// directory, waits until it answers PING, and stops it when the test ends.
func RedisServer(t testing.TB, opts ...RedisOption) *Redis {
	t.Helper()
	var cfg redisConfig
	for _, o := range opts {
		o(&cfg)
	}
	socket := ""
	if cfg.socket {
		socket = SocketPath(t, "redis.sock")
		cfg.args = append(cfg.args, "--unixsocket", socket, "--unixsocketperm", "700")
	}
	spec := nodeSpec{
		name:     "redis-server",
		bin:      redisServerBinary(t),
		password: cfg.password,
		args: func(port int, dir string) ([]string, error) {
			return append(baseRedisArgs(port, dir), cfg.args...), nil
		},
		tls:        cfg.tls,
		clientAuth: cfg.clientAuth,
	}
	if cfg.withTLS && spec.tls == nil {
		spec.tls = NewTLSFiles(t)
	}
	r := startNode(t, spec)
	r.Socket = socket
	return r
}

// baseRedisArgs are the arguments every data-holding redis-server gets.
func baseRedisArgs(port int, dir string) []string {
	return []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--daemonize", "no",
		"--logfile", "",
		// Full syncs start at once instead of after the default 5 s, so
		// replicas attach quickly.
		"--repl-diskless-sync-delay", "0",
	}
}

func redisServerBinary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found in PATH: %s", redisInstallHint)
	}
	return bin
}

// startNode creates the handle, registers its cleanup and starts the process,
// retrying on a fresh port when the chosen one was taken.
func startNode(t testing.TB, spec nodeSpec) *Redis {
	t.Helper()
	dir := t.TempDir() // removed after the cleanup registered below has run
	r := &Redis{
		t:        t,
		name:     spec.name,
		bin:      spec.bin,
		password: spec.password,
		dir:      dir,
		logPath:  filepath.Join(dir, "server.log"),
	}
	t.Cleanup(r.cleanup)
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("testenv: %s: find a free port: %v", spec.name, err)
		}
		args, err := spec.args(port, dir)
		if err != nil {
			t.Fatalf("testenv: %s: %v", spec.name, err)
		}
		tlsPort := 0
		if spec.tls != nil {
			if tlsPort, err = freePort(); err != nil {
				t.Fatalf("testenv: %s: find a free TLS port: %v", spec.name, err)
			}
			args = append(args, spec.tls.redisArgs(tlsPort, spec.clientAuth)...)
		}
		r.mu.Lock()
		r.Port, r.Addr, r.args = port, loopbackAddr(port), args
		if spec.tls != nil {
			r.TLSAddr, r.TLS = loopbackAddr(tlsPort), spec.tls
		}
		err = r.startLocked()
		r.mu.Unlock()
		if err == nil {
			return r
		}
		lastErr = err
		if !errors.Is(err, errPortInUse) {
			break
		}
	}
	t.Fatalf("testenv: start %s: %v\n%s", spec.name, lastErr, r.logTail())
	return nil
}

// Start starts the server again on the same port after Stop or Kill and waits
// until it answers PING. The data is gone unless the server was configured to
// persist it.
func (r *Redis) Start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		r.t.Fatalf("testenv: %s %s: Start: already running", r.name, r.Addr)
	}
	if err := r.startLocked(); err != nil {
		r.t.Fatalf("testenv: restart %s %s: %v\n%s", r.name, r.Addr, err, r.logTail())
	}
}

// Stop sends SIGTERM (after SIGCONT when paused) and waits for the process to
// exit, escalating to SIGKILL after a deadline. The port stays reserved for
// Start. Stop on a stopped server does nothing.
func (r *Redis) Stop() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return
	}
	if r.paused {
		_ = r.proc.cmd.Process.Signal(syscall.SIGCONT)
		r.paused = false
	}
	_ = r.proc.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.proc.done:
	case <-time.After(stopTimeout):
		_ = r.proc.cmd.Process.Kill()
		<-r.proc.done
	}
	r.proc = nil
}

// Kill sends SIGKILL and waits for the process to exit. Kill on a stopped
// server does nothing.
func (r *Redis) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.killLocked()
}

// Pause freezes the process with SIGSTOP and returns once the kernel reports
// it stopped: connections stay open but nothing is answered (a black hole).
func (r *Redis) Pause() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		r.t.Fatalf("testenv: %s %s: Pause: not running", r.name, r.Addr)
	}
	if err := r.proc.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		r.t.Fatalf("testenv: %s %s: SIGSTOP: %v", r.name, r.Addr, err)
	}
	r.paused = true
	if err := waitProcState(r.proc, true); err != nil {
		r.t.Fatalf("testenv: %s %s: Pause: %v", r.name, r.Addr, err)
	}
}

// Resume continues a paused process with SIGCONT.
func (r *Redis) Resume() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil || !r.paused {
		return
	}
	if err := r.proc.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		r.t.Fatalf("testenv: %s %s: SIGCONT: %v", r.name, r.Addr, err)
	}
	r.paused = false
	if err := waitProcState(r.proc, false); err != nil {
		r.t.Fatalf("testenv: %s %s: Resume: %v", r.name, r.Addr, err)
	}
}

// Running reports whether the process is running (paused counts as running).
func (r *Redis) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc != nil
}

// Dir returns the server's temporary working directory.
func (r *Redis) Dir() string { return r.dir }

// Log returns the end of the server's log (stdout and stderr of every start).
func (r *Redis) Log() string { return r.logTail() }

// Client returns a go-redis client for this server, created on first use and
// closed when the test ends. It reconnects by itself after Stop/Start.
func (r *Redis) Client() *redis.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.client == nil {
		r.client = redis.NewClient(&redis.Options{
			Addr:     r.Addr,
			Password: r.password,
		})
	}
	return r.client
}

// Info returns the fields of one INFO section of the server as name →
// value ("used_memory" → "1234567"). It fails the test when the server does
// not answer.
func (r *Redis) Info(t testing.TB, section string) map[string]string {
	t.Helper()
	info, err := r.Client().Info(context.Background(), section).Result()
	if err != nil {
		t.Fatalf("testenv: INFO %s of %s: %v", section, r.Addr, err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if name, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok { // "# Section" lines have no colon
			fields[name] = v
		}
	}
	return fields
}

// InfoInt returns the integer field name of an INFO section; it fails the
// test when the field is missing or not an integer.
func (r *Redis) InfoInt(t testing.TB, section, name string) int64 {
	t.Helper()
	v, ok := r.Info(t, section)[name]
	n, err := strconv.ParseInt(v, 10, 64)
	if !ok || err != nil {
		t.Fatalf("testenv: INFO %s of %s: field %s = %q (%v)", section, r.Addr, name, v, err)
	}
	return n
}

// CPU returns the server's CPU time so far (INFO cpu, used_cpu_user plus
// used_cpu_sys); it fails the test when a field is missing or malformed.
func (r *Redis) CPU(t testing.TB) time.Duration {
	t.Helper()
	info := r.Info(t, "cpu")
	var total float64
	for _, name := range []string{"used_cpu_user", "used_cpu_sys"} {
		f, err := strconv.ParseFloat(info[name], 64)
		if err != nil {
			t.Fatalf("testenv: INFO cpu of %s: field %s = %q: %v", r.Addr, name, info[name], err)
		}
		total += f
	}
	return time.Duration(total * float64(time.Second))
}

// CommandCalls returns the server's INFO commandstats as command name
// (lower case, "config|resetstat" for subcommands) → calls. It fails the
// test when the server does not answer or the section cannot be parsed.
func (r *Redis) CommandCalls(t testing.TB) map[string]int64 {
	t.Helper()
	calls := map[string]int64{}
	for name, rest := range r.Info(t, "commandstats") {
		cmd, ok := strings.CutPrefix(name, "cmdstat_")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("testenv: INFO commandstats of %s: %s:%s: %v", r.Addr, name, rest, err)
		}
		calls[cmd] = n
	}
	return calls
}

// Client is one connection in CLIENT LIST.
type Client struct {
	// Addr is the peer's address: "ip:port", or "<socket path>:0" for a
	// connection on the Unix socket.
	Addr string
	// LocalAddr is the server's address the connection came in on: its
	// TCP port's, its TLS port's, or "<socket path>:0".
	LocalAddr string
	// Flags are CLIENT LIST's flags ("U" for a Unix socket client, "N"
	// for none).
	Flags string
	// Resp is the connection's protocol version ("2", "3").
	Resp string
}

// OnSocket reports whether c came in on the Unix socket at path.
func (c Client) OnSocket(path string) bool {
	return c.Addr == path+":0" && strings.Contains(c.Flags, "U")
}

// Clients returns the server's client connections but the one that asks
// (CLIENT LIST over TCP).
func (r *Redis) Clients(t testing.TB) []Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	c := r.Client()
	id, err := c.ClientID(ctx).Result()
	if err != nil {
		t.Fatalf("testenv: CLIENT ID on %s: %v", r.Addr, err)
	}
	list, err := c.ClientList(ctx).Result()
	if err != nil {
		t.Fatalf("testenv: CLIENT LIST on %s: %v", r.Addr, err)
	}
	var out []Client
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		var cl Client
		self := false
		for _, field := range strings.Fields(line) {
			k, v, _ := strings.Cut(field, "=")
			switch k {
			case "id":
				self = v == strconv.FormatInt(id, 10)
			case "addr":
				cl.Addr = v
			case "laddr":
				cl.LocalAddr = v
			case "flags":
				cl.Flags = v
			case "resp":
				cl.Resp = v
			}
		}
		if !self {
			out = append(out, cl)
		}
	}
	return out
}

// CheckClientsOnSocket fails the test unless the server has client
// connections (but the asker's) and every one came in on its Unix socket
// (WithUnixSocket): whoever connected used the socket, not the TCP port.
func (r *Redis) CheckClientsOnSocket(t testing.TB) {
	t.Helper()
	r.checkClients(t, "the socket "+r.Socket, func(c Client) bool { return c.OnSocket(r.Socket) })
}

// CheckClientsOnTLS fails the test unless the server has client
// connections (but the asker's) and every one came in on its TLS port
// (WithTLS): whoever connected spoke TLS, not plain TCP.
func (r *Redis) CheckClientsOnTLS(t testing.TB) {
	t.Helper()
	r.checkClients(t, "the TLS port "+r.TLSAddr, func(c Client) bool { return r.TLSAddr != "" && c.LocalAddr == r.TLSAddr })
}

// checkClients fails the test unless the server has client connections
// (but the asker's) and on holds for every one.
func (r *Redis) checkClients(t testing.TB, where string, on func(Client) bool) {
	t.Helper()
	clients := r.Clients(t)
	for _, c := range clients {
		if !on(c) {
			t.Errorf("connection %+v is not on %s", c, where)
		}
	}
	if len(clients) == 0 {
		t.Errorf("no client connection on %s", r.Addr)
	}
}

// ScriptCalls returns how many scripts and functions the server has run:
// the calls of EVAL, EVALSHA, FCALL and FCALL_RO together. A call answered
// NOSCRIPT or "Function not found" counts too (Redis counts it in calls and
// failed_calls), so callers load the code before they start counting.
func (r *Redis) ScriptCalls(t testing.TB) int64 {
	t.Helper()
	c := r.CommandCalls(t)
	return c["eval"] + c["evalsha"] + c["fcall"] + c["fcall_ro"]
}

// startLocked starts the process with r.args and waits until it is ready.
func (r *Redis) startLocked() error {
	p, err := startProcess(r.bin, r.args, r.dir, r.logPath)
	if err != nil {
		return err
	}
	r.proc, r.paused = p, false

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	err = waitPing(ctx, r.Addr, p.done)
	if err == nil && !listensOn(p.cmd.Process.Pid, r.Port) {
		// Another server answered on the port (one a parallel test
		// binary started there since it was free): ours could not bind
		// it, and exits.
		select {
		case <-p.done:
			err = fmt.Errorf("another server answers on %s", r.Addr)
		case <-ctx.Done():
			err = fmt.Errorf("another server answers on %s, and this one (pid %d) does not listen there", r.Addr, p.cmd.Process.Pid)
		}
	}
	if err != nil {
		r.killLocked()
		if strings.Contains(r.logTail(), "Address already in use") {
			return fmt.Errorf("%s: %w", r.Addr, errPortInUse)
		}
		return err
	}
	return nil
}

// listensOn reports whether process pid holds a listening TCP socket on
// port (of 127.0.0.1 or any address): one of its descriptors is a socket
// that /proc/net/tcp or tcp6 lists in state LISTEN on that port.
func listensOn(pid, port int) bool {
	inodes := map[string]bool{}
	suffix := fmt.Sprintf(":%04X", port)
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) > 9 && strings.HasSuffix(f[1], suffix) && f[3] == "0A" {
				inodes[f[9]] = true
			}
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false
	}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); err == nil && ok && inodes[strings.TrimSuffix(inode, "]")] {
			return true
		}
	}
	return false
}

// startProcess starts bin with args in dir, appending its stdout and stderr
// to logPath. A goroutine owned by the returned process waits for the exit and
// closes done; it ends when the process does.
func startProcess(bin string, args []string, dir, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	fmt.Fprintf(logFile, "### testenv: %s %s\n", bin, strings.Join(quoteArgs(args), " "))
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	DieWithParent(cmd)
	err = cmd.Start()
	logFile.Close() // the child holds its own descriptor
	if err != nil {
		return nil, fmt.Errorf("exec %s: %w", bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// kill sends SIGKILL and waits for the exit.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (r *Redis) killLocked() {
	if r.proc == nil {
		return
	}
	r.proc.kill()
	r.proc, r.paused = nil, false
}

func (r *Redis) cleanup() {
	r.mu.Lock()
	r.killLocked()
	if r.client != nil {
		_ = r.client.Close()
		r.client = nil
	}
	r.mu.Unlock()
	if r.t.Failed() {
		r.t.Logf("testenv: %s %s log (%s):\n%s", r.name, r.Addr, r.logPath, r.logTail())
	}
}

func (r *Redis) logTail() string { return readTail(r.logPath) }

// readTail returns the last logTail bytes of the file at path.
func readTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > logTail {
		b = append([]byte("...\n"), b[len(b)-logTail:]...)
	}
	return string(b)
}

// waitPing polls addr with a raw RESP PING until the server answers (an error
// reply other than LOADING counts: the server is up but wants AUTH), the
// process exits (done is closed) or ctx ends.
func waitPing(ctx context.Context, addr string, done <-chan struct{}) error {
	var lastErr error
	for {
		if lastErr = ping(ctx, addr); lastErr == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("process exited before answering PING on %s", addr)
		case <-ctx.Done():
			return fmt.Errorf("no answer to PING on %s: %w (last error: %v)", addr, ctx.Err(), lastErr)
		case <-time.After(pollInterval):
		}
	}
}

func ping(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	switch {
	case strings.HasPrefix(line, "+PONG"):
		return nil
	case strings.HasPrefix(line, "-LOADING"):
		return fmt.Errorf("server loading: %s", strings.TrimSpace(line))
	case strings.HasPrefix(line, "-"):
		return nil // up, but e.g. NOAUTH
	default:
		return fmt.Errorf("unexpected PING reply %q", line)
	}
}

// waitProcState waits until the kernel reports the process stopped (state T)
// or, with stopped false, not stopped.
func waitProcState(p *process, stopped bool) error {
	path := fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid)
	deadline := time.Now().Add(readyTimeout)
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil // no procfs (or the process is gone): nothing to wait for
		}
		// The state follows the parenthesised command name: "pid (comm) S ...".
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) {
			return nil
		}
		state := s[i+2]
		if (state == 'T' || state == 't') == stopped {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process state %q after %v", state, readyTimeout)
		}
		select {
		case <-p.done:
			return errors.New("process exited")
		case <-time.After(time.Millisecond):
		}
	}
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'") {
			a = strconv.Quote(a)
		}
		out[i] = a
	}
	return out
}
