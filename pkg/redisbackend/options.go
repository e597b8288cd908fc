package redisbackend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/envoy-rls/envoy-rls/internal/listen"
)

// Defaults of Options.
const (
	// DefaultKeyPrefix is the prefix of every key the backend writes.
	DefaultKeyPrefix = "rls:"
	// DefaultTimeout bounds one Check when the caller's context allows
	// longer. Envoy's own rate-limit timeout defaults to 20 ms and the
	// caller normally passes that deadline, so this only caps callers
	// without a deadline (or with a long one).
	DefaultTimeout = 50 * time.Millisecond
)

// Options configures New. Exactly one of URL, ClusterAddrs and SentinelAddrs
// selects the topology.
type Options struct {
	// URL of a single Redis node: redis://[user:password@]host:port[/db],
	// rediss:// for TLS, or unix:///path/to/redis.sock[?db=N] for a Redis on
	// the same host, over its Unix socket (flag --redis.url).
	URL string
	// ClusterAddrs are seed addresses (host:port) of a Redis Cluster
	// (flag --redis.cluster-addrs).
	ClusterAddrs []string
	// SentinelAddrs are the addresses of Sentinel processes
	// (flag --redis.sentinel-addrs); SentinelMaster names the monitored
	// master (flag --redis.sentinel-master) and is required with them.
	SentinelAddrs  []string
	SentinelMaster string
	// SentinelUsername and SentinelPassword authenticate with the
	// Sentinels themselves when they require it.
	SentinelUsername string
	SentinelPassword string
	// Username and Password authenticate with Redis (ACL user, or
	// requirepass with an empty Username). When set they override the
	// credentials of URL.
	Username string
	Password string
	// TLS, when set, enables TLS: it is called as each connection is
	// dialled, for that connection's configuration, so that renewed
	// certificates and authorities are used from the next connection on
	// (internal/tlsfiles.ClientSource.Config reads them from the PEM files
	// of --redis.tls.*). It is called from many goroutines at once; it
	// must not return nil (the dial fails), and the configuration it
	// returns is not modified. With a rediss:// URL and a nil TLS,
	// go-redis's default TLS configuration is used.
	TLS func() *tls.Config
	// PoolSize is the maximum number of connections per Redis node; 0
	// means go-redis's default (10 per CPU).
	PoolSize int
	// KeyPrefix starts every key; "" means DefaultKeyPrefix. It must not
	// contain '{' or '}' (the hash tag must be the counter id).
	KeyPrefix string
	// Timeout bounds each Check, Ping and Beat in addition to the
	// caller's context (the shorter wins); 0 means DefaultTimeout, a
	// negative value means only the context bounds calls.
	Timeout time.Duration
	// Now, when set, is the clock the scripts decide at (tests). nil
	// means Redis TIME, so instances with skewed clocks agree.
	Now func() time.Time
	// DisableFunctions runs checks as scripts (EVALSHA) instead of as a
	// Redis Function (FCALL). By default (false) the check function is
	// loaded with FUNCTION LOAD on first use, which spares Redis
	// redefining every helper on each call; servers that do not support
	// Functions (Redis before 7.0, proxies) or forbid them (ACL) are
	// detected on the first check and served with scripts. Set it when
	// FUNCTION LOAD must not be used at all (flag --redis.functions=false).
	DisableFunctions bool
	// Senders is the number of coalesced calls in flight at once (see
	// "Coalescing" in coalesce.go): on a single node or Sentinel, script
	// calls that decide every queued Check; on a Cluster, pipelines of the
	// queued Checks' per-slot calls. 0 means DefaultSenders; a negative
	// value turns coalescing off, so that every Check is a call of its own
	// (one per hash slot on a Cluster) (flag --redis.senders).
	Senders int
	// MaxBatch bounds the requests (limits) of one coalesced call; 0 means
	// DefaultMaxBatch (flag --redis.max-batch). A Check larger than it is
	// still sent whole, alone.
	MaxBatch int
	// SpareAfter is how long every coalesced call in flight must have
	// taken before another of the Senders slots starts a call: while Redis
	// answers sooner, one call at a time carries every queued Check, and a
	// stalled call holds the Checks behind it up for no longer than this.
	// 0 (or a negative value) lets every slot start a call at once (flag
	// --redis.spare-after).
	SpareAfter time.Duration
}

// topology is the validated choice among URL, cluster and Sentinel.
type topology uint8

const (
	topoURL topology = iota
	topoCluster
	topoSentinel
)

// Check returns what New would refuse in o before connecting: the choice
// of topology (exactly one of URL, ClusterAddrs and SentinelAddrs, a
// Sentinel with its master), the key prefix, negative sizes. A caller
// checks its flags with it before it starts anything.
func (o Options) Check() error {
	_, err := o.validate()
	return err
}

func (o *Options) validate() (topology, error) {
	var set []string
	var topo topology
	if o.URL != "" {
		set, topo = append(set, "--redis.url"), topoURL
	}
	if len(o.ClusterAddrs) > 0 {
		set, topo = append(set, "--redis.cluster-addrs"), topoCluster
	}
	if len(o.SentinelAddrs) > 0 {
		set, topo = append(set, "--redis.sentinel-addrs"), topoSentinel
	}
	var errs []error
	switch len(set) {
	case 0:
		errs = append(errs, errors.New("no Redis configured: set one of --redis.url, --redis.cluster-addrs or --redis.sentinel-addrs"))
	case 1:
	default:
		errs = append(errs, fmt.Errorf("%s are mutually exclusive: set only one", strings.Join(set, " and ")))
	}
	if topo == topoSentinel && o.SentinelMaster == "" {
		errs = append(errs, errors.New("--redis.sentinel-master is required with --redis.sentinel-addrs"))
	}
	if o.SentinelMaster != "" && len(o.SentinelAddrs) == 0 {
		errs = append(errs, errors.New("--redis.sentinel-master is set but --redis.sentinel-addrs is empty"))
	}
	for _, a := range append(o.ClusterAddrs[:len(o.ClusterAddrs):len(o.ClusterAddrs)], o.SentinelAddrs...) {
		if strings.TrimSpace(a) == "" {
			errs = append(errs, errors.New("--redis.cluster-addrs and --redis.sentinel-addrs must not contain empty addresses"))
			break
		}
	}
	if err := validatePrefix(o.KeyPrefix); err != nil {
		errs = append(errs, err)
	}
	if o.PoolSize < 0 {
		errs = append(errs, fmt.Errorf("--redis.pool-size %d is negative", o.PoolSize))
	}
	if o.MaxBatch < 0 {
		errs = append(errs, fmt.Errorf("--redis.max-batch %d is negative", o.MaxBatch))
	}
	// The pool's size is checked against the senders once the client is
	// built (checkPool): pool_size and max_active_conns in --redis.url
	// and go-redis's default count too.
	return topo, errors.Join(errs...)
}

// senders returns the number of coalescing sender slots o asks for: Senders,
// DefaultSenders for 0, none when coalescing is off.
func (o *Options) senders() int {
	switch {
	case o.Senders < 0:
		return 0
	case o.Senders == 0:
		return DefaultSenders
	}
	return o.Senders
}

// validatePrefix rejects a key prefix that would take over the hash tag.
func validatePrefix(p string) error {
	if strings.ContainsAny(p, "{}") {
		return fmt.Errorf("--redis.key-prefix %q must not contain '{' or '}'", p)
	}
	return nil
}

// newClient builds the go-redis client of the validated topology.
//
// Automatic retries are off (MaxRetries −1): a script whose reply was lost
// may already have consumed, so running it again would count twice. A failed
// call is reported as limiter.ErrUnavailable instead and the fail-soft layer
// decides. The Cluster client still follows MOVED/ASK redirections
// (MaxRedirects, go-redis's default 3), which is safe because a redirected
// command did not run; a script call refused with TRYAGAIN, which did not
// run either, is resent by the backend itself (see "Resending after
// TRYAGAIN" in cluster.go), since go-redis does not resend noRetry
// commands. Deadlines of the context apply to the network I/O
// (ContextTimeoutEnabled). A refused dial is not retried (DialerRetries 1;
// go-redis's default of 5 with backoff would turn a refused connection into
// a timeout that uses up the caller's deadline): the circuit breaker above
// decides when to try again.
//
// The connections speak RESP2 (Protocol 2) unless a --redis.url asks for
// another: on a RESP3 connection go-redis looks for push notifications after
// every command, a recvfrom(MSG_PEEK) system call and three allocations per
// call, and envoy-rls uses nothing that RESP3 adds.
func (o *Options) newClient(topo topology) (redis.UniversalClient, error) {
	// Cluster and Sentinel share these, through go-redis's own conversions.
	u := &redis.UniversalOptions{
		Username:              o.Username,
		Password:              o.Password,
		Dialer:                o.dialer(0),
		PoolSize:              o.PoolSize,
		Protocol:              2,
		MaxRetries:            -1,
		DialerRetries:         1,
		ContextTimeoutEnabled: true,
	}
	switch topo {
	case topoCluster:
		u.Addrs = o.ClusterAddrs
		co := u.Cluster()
		// No sleep before a pipeline follows MOVED or ASK (go-redis's 10 ms
		// minimum otherwise): a redirected command did not run, and every
		// script call is noRetry, so this backoff applies to redirections
		// alone.
		co.MinRetryBackoff = -1
		return redis.NewClusterClient(co), nil
	case topoSentinel:
		u.Addrs, u.MasterName = o.SentinelAddrs, o.SentinelMaster
		u.SentinelUsername, u.SentinelPassword = o.SentinelUsername, o.SentinelPassword
		return redis.NewFailoverClient(u.Failover()), nil
	default:
		ro, err := redis.ParseURL(o.URL)
		if err != nil {
			return nil, fmt.Errorf("--redis.url: %w", withoutURL(err))
		}
		if ro.Network == "unix" {
			if err := checkSocketURL(o.URL, ro.Addr, o.TLS != nil); err != nil {
				return nil, err
			}
		}
		if o.Username != "" {
			ro.Username = o.Username
		}
		if o.Password != "" {
			ro.Password = o.Password
		}
		if o.TLS != nil {
			ro.TLSConfig, ro.Dialer = nil, o.dialer(ro.DialTimeout)
		}
		if o.PoolSize > 0 {
			ro.PoolSize = o.PoolSize
		}
		if ro.Protocol == 0 { // not set in the URL (?protocol=)
			ro.Protocol = 2
		}
		ro.MaxRetries = -1
		ro.DialerRetries = 1
		ro.ContextTimeoutEnabled = true
		// Maintenance notifications are a Redis Enterprise feature; asking
		// for them costs a command per new connection, and go-redis's
		// "auto" fallback, which rewrites the shared options when a server
		// refuses, races between connections opened through
		// redis.Client.Conn (the coalescing sender slots'). Failover clients
		// have them off already.
		ro.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
		return redis.NewClient(ro), nil
	}
}

// dialer returns the go-redis dialer of connections on TLS, each with the
// configuration o.TLS returns as it is dialled; nil, go-redis's own, when
// TLS is not set. timeout bounds a dial (0: go-redis's default, 5 s).
//
// go-redis's own TLSConfig is then left nil: its dialer is replaced, and
// the other code that reads TLSConfig (maintenance notifications and
// their handoff dialer) is off (single node, Sentinel) or needs RESP3
// (Cluster). Turning either on must give them TLS another way.
func (o *Options) dialer(timeout time.Duration) func(context.Context, string, string) (net.Conn, error) {
	if o.TLS == nil {
		return nil
	}
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	config := o.TLS
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cfg := config()
		if cfg == nil {
			// redis.NewDialer would dial in plain text.
			return nil, fmt.Errorf("dial %s: no TLS configuration", addr)
		}
		return redis.NewDialer(&redis.Options{DialTimeout: timeout, TLSConfig: cfg})(ctx, network, addr)
	}
}

// withoutURL is err without the URL a *url.Error quotes whole, password
// included: the error of a --redis.url that does not parse goes to the
// log.
func withoutURL(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	var esc url.EscapeError // quotes the escape, perhaps a piece of the password
	if errors.As(ue.Err, &esc) {
		return fmt.Errorf("%s: a %% not followed by two hexadecimal digits (write a %% in a password as %%25)", ue.Op)
	}
	return fmt.Errorf("%s: %w", ue.Op, ue.Err)
}

// checkSocketURL refuses, at start, a unix:// --redis.url that would fail
// at every connection, or reach another socket than it seems to name.
func checkSocketURL(rawURL, path string, withTLS bool) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("--redis.url: %w", withoutURL(err))
	}
	switch {
	case u.Host != "":
		// go-redis would dial the path alone: unix://var/run/x.sock is
		// /run/x.sock.
		return fmt.Errorf("--redis.url %s names a host (%s); a Unix socket's URL is unix:///absolute/path", u.Redacted(), u.Host)
	case len(path) > listen.MaxPath:
		return fmt.Errorf("--redis.url: socket path %s is %d bytes, longer than a Unix socket address holds (%d)", path, len(path), listen.MaxPath)
	case withTLS:
		// Redis serves TLS on its TCP tls-port only: a handshake on its
		// Unix socket would fail at every connection.
		return fmt.Errorf("--redis.url %s is a Unix socket, which Redis serves without TLS: remove the --redis.tls.* flags", path)
	}
	return nil
}
