package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// SentinelMasterName is the name the sentinels monitor the master under.
	SentinelMasterName = "testmaster"
	// sentinelCount is the number of sentinel processes; sentinelQuorum of them
	// must agree that the master is down.
	sentinelCount  = 3
	sentinelQuorum = 2
	// sentinelDownAfter is down-after-milliseconds: a master that does not
	// answer for this long is subjectively down.
	sentinelDownAfter = 1000
	// sentinelFailoverTimeout is failover-timeout (ms).
	sentinelFailoverTimeout = 5000
	// sentinelReadyTimeout bounds the wait until every sentinel sees the
	// master, the replica and the other sentinels.
	sentinelReadyTimeout = 60 * time.Second
)

// Sentinel is a Sentinel-managed Redis: a master, one replica and three
// sentinels (quorum 2, down-after-milliseconds 1000) on loopback ports. Its
// methods are safe for concurrent use; those that fail the test must run on
// the test goroutine.
type Sentinel struct {
	// MasterName is the name the sentinels monitor (SentinelMasterName).
	MasterName string
	// SentinelAddrs are the addresses of the three sentinels.
	SentinelAddrs []string
	// Master is the initial master, Replica its replica. After a failover
	// their roles are swapped; use MasterAddr or WaitFailover to learn which
	// address is the master now.
	Master  *Redis
	Replica *Redis
	// Sentinels are the sentinel processes (redis-server --sentinel).
	Sentinels []*Redis
	// SentinelTLSAddrs are the sentinels' TLS addresses and TLS the
	// certificates every process serves (WithSentinelTLS; empty
	// otherwise). With TLS the sentinels name the data nodes by their TLS
	// addresses.
	SentinelTLSAddrs []string
	TLS              *TLSFiles

	t       testing.TB
	mu      sync.Mutex
	current string // master address as of creation or the last WaitFailover
	client  *redis.Client
}

// SentinelOption configures RedisSentinel.
type SentinelOption func(*sentinelConfig)

type sentinelConfig struct {
	tls        bool
	clientAuth bool
}

// WithSentinelTLS makes every process (master, replica, sentinels) serve
// TLS on a second port as well, with certificates of one new authority
// (Sentinel.TLS), and speak TLS to one another (tls-replication yes): the
// replica replicates from the master's TLS port, and the sentinels monitor
// it there, so they name the data nodes by their TLS addresses. With
// clientAuth a client must present a certificate signed by the authority.
func WithSentinelTLS(clientAuth bool) SentinelOption {
	return func(c *sentinelConfig) { c.tls, c.clientAuth = true, clientAuth }
}

// RedisSentinel starts a master, a replica of it, and three sentinels
// monitoring it, and waits until every sentinel sees the master, the replica
// and the two other sentinels (so a failover can be authorised). Everything is
// stopped when the test ends.
func RedisSentinel(t testing.TB, opts ...SentinelOption) *Sentinel {
	t.Helper()
	var cfg sentinelConfig
	for _, o := range opts {
		o(&cfg)
	}
	bin := redisServerBinary(t)
	s := &Sentinel{t: t, MasterName: SentinelMasterName}
	var dataOpts []RedisOption
	if cfg.tls {
		s.TLS = NewTLSFiles(t)
		dataOpts = append(dataOpts, withTLSFiles(s.TLS, cfg.clientAuth), WithArgs("--tls-replication", "yes"))
	}
	master := RedisServer(t, dataOpts...)
	s.Master = master
	replica := RedisServer(t, append(dataOpts, WithReplicaOf(s.advertised(master)))...)
	s.Replica = replica
	s.current = s.advertised(master)
	t.Cleanup(s.cleanup)

	ctx, cancel := context.WithTimeout(context.Background(), sentinelReadyTimeout)
	defer cancel()
	// Sentinels learn replicas from the master's INFO; a replica that is
	// already attached is seen at once.
	if err := poll(ctx, func() error { return replicaLinkUp(ctx, replica) }); err != nil {
		t.Fatalf("testenv: sentinel setup: replica of %s: %v", master.Addr, err)
	}

	for i := 0; i < sentinelCount; i++ {
		sn := startNode(t, nodeSpec{
			name: fmt.Sprintf("redis-sentinel-%d", i),
			bin:  bin,
			args: func(port int, dir string) ([]string, error) {
				conf := filepath.Join(dir, "sentinel.conf")
				host, mport, _ := net.SplitHostPort(s.advertised(master))
				lines := []string{
					fmt.Sprintf("port %d", port),
					"bind 127.0.0.1",
					"daemonize no",
					`logfile ""`,
					fmt.Sprintf("dir %q", dir),
					fmt.Sprintf("sentinel monitor %s %s %s %d", SentinelMasterName, host, mport, sentinelQuorum),
					fmt.Sprintf("sentinel down-after-milliseconds %s %d", SentinelMasterName, sentinelDownAfter),
					fmt.Sprintf("sentinel failover-timeout %s %d", SentinelMasterName, sentinelFailoverTimeout),
					fmt.Sprintf("sentinel parallel-syncs %s 1", SentinelMasterName),
				}
				if cfg.tls {
					// To the data nodes and to one another.
					lines = append(lines, "tls-replication yes")
				}
				text := strings.Join(append(lines, ""), "\n")
				if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
					return nil, fmt.Errorf("write sentinel config: %w", err)
				}
				return []string{conf, "--sentinel"}, nil
			},
			tls:        s.TLS,
			clientAuth: cfg.clientAuth,
		})
		s.Sentinels = append(s.Sentinels, sn)
		s.SentinelAddrs = append(s.SentinelAddrs, sn.Addr)
		if s.TLS != nil {
			s.SentinelTLSAddrs = append(s.SentinelTLSAddrs, sn.TLSAddr)
		}
	}

	if err := poll(ctx, s.ready(ctx)); err != nil {
		t.Fatalf("testenv: sentinels not ready: %v", err)
	}
	return s
}

// ready returns a probe that succeeds when every sentinel sees the master as
// healthy, one healthy replica and the other sentinels.
func (s *Sentinel) ready(ctx context.Context) func() error {
	return func() error {
		for _, sn := range s.Sentinels {
			sc := s.sentinelClient(sn)
			m, err := sc.Master(ctx, s.MasterName).Result()
			sc.Close()
			if err != nil {
				return fmt.Errorf("sentinel %s: SENTINEL MASTER: %w", sn.Addr, err)
			}
			if m["flags"] != "master" || m["num-slaves"] != "1" ||
				m["num-other-sentinels"] != fmt.Sprint(sentinelCount-1) {
				return fmt.Errorf("sentinel %s: flags=%q num-slaves=%q num-other-sentinels=%q",
					sn.Addr, m["flags"], m["num-slaves"], m["num-other-sentinels"])
			}
			addr := net.JoinHostPort(m["ip"], m["port"])
			if want := s.advertised(s.Master); addr != want {
				return fmt.Errorf("sentinel %s: master %s, want %s", sn.Addr, addr, want)
			}
		}
		return nil
	}
}

// sentinelClient returns a new client for one sentinel; the caller closes it.
func (s *Sentinel) sentinelClient(sn *Redis) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{
		Addr:        sn.Addr,
		DialTimeout: time.Second,
		ReadTimeout: 2 * time.Second,
		MaxRetries:  -1,
	})
}

// advertised is the address by which the sentinels know the data node n:
// its TLS address with WithSentinelTLS.
func (s *Sentinel) advertised(n *Redis) string {
	if s.TLS != nil {
		return n.TLSAddr
	}
	return n.Addr
}

// Client returns a go-redis failover client (NewFailoverClient) for the
// monitored master, created on first use and closed when the test ends.
// With WithSentinelTLS it speaks TLS to the sentinels and the master, with
// the client certificate of TLS.
func (s *Sentinel) Client() *redis.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client == nil {
		opts := &redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.SentinelAddrs}
		if s.TLS != nil {
			cfg, err := s.TLS.ClientConfig()
			if err != nil {
				s.t.Fatalf("testenv: sentinel client: %v", err)
			}
			opts.SentinelAddrs, opts.TLSConfig = s.SentinelTLSAddrs, cfg
		}
		s.client = redis.NewFailoverClient(opts)
	}
	return s.client
}

// MasterAddr asks the running sentinels (SENTINEL get-master-addr-by-name) for
// the master address and returns it when all that answer agree.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	var addr string
	answered := 0
	for _, sn := range s.Sentinels {
		if !sn.Running() {
			continue
		}
		sc := s.sentinelClient(sn)
		hp, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
		sc.Close()
		if err != nil {
			continue
		}
		if len(hp) != 2 {
			return "", fmt.Errorf("sentinel %s: get-master-addr-by-name: %v", sn.Addr, hp)
		}
		a := net.JoinHostPort(hp[0], hp[1])
		if answered > 0 && a != addr {
			return "", fmt.Errorf("sentinels disagree on the master: %s vs %s", addr, a)
		}
		addr = a
		answered++
	}
	if answered == 0 {
		return "", fmt.Errorf("no sentinel answered get-master-addr-by-name %s", s.MasterName)
	}
	return addr, nil
}

// WaitFailover waits until every running sentinel reports a master address
// different from the one known at creation (or at the previous WaitFailover)
// and the new master answers ROLE as a master. It returns the new address.
func (s *Sentinel) WaitFailover(ctx context.Context) (string, error) {
	s.mu.Lock()
	old := s.current
	s.mu.Unlock()
	var addr string
	err := poll(ctx, func() error {
		a, err := s.MasterAddr(ctx)
		if err != nil {
			return err
		}
		if a == old {
			return fmt.Errorf("master is still %s", a)
		}
		n := s.Node(a)
		if n == nil {
			return fmt.Errorf("new master %s is not a node of this setup", a)
		}
		role, err := n.Client().Do(ctx, "ROLE").Slice()
		if err != nil {
			return fmt.Errorf("ROLE on new master %s: %w", a, err)
		}
		if len(role) == 0 || role[0] != "master" {
			return fmt.Errorf("new master %s has role %v", a, role)
		}
		addr = a
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("wait for failover away from %s: %w", old, err)
	}
	s.mu.Lock()
	s.current = addr
	s.mu.Unlock()
	return addr, nil
}

// Node returns the data node (Master or Replica) listening on addr (its
// plain or its TLS address), or nil.
func (s *Sentinel) Node(addr string) *Redis {
	for _, n := range []*Redis{s.Master, s.Replica} {
		if n.Addr == addr || (n.TLSAddr != "" && n.TLSAddr == addr) {
			return n
		}
	}
	return nil
}

func (s *Sentinel) cleanup() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client != nil {
		_ = s.client.Close()
		s.client = nil
	}
}

func replicaLinkUp(ctx context.Context, r *Redis) error {
	info, err := r.Client().Info(ctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("%s: INFO replication: %w", r.Addr, err)
	}
	if !strings.Contains(info, "master_link_status:up") {
		return fmt.Errorf("%s: replica link not up", r.Addr)
	}
	return nil
}
