package testenv

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// clusterMasters is the number of masters of a Cluster.
	clusterMasters = 3
	// clusterSlots is the number of hash slots of Redis Cluster.
	clusterSlots = 16384
	// clusterNodeTimeout is cluster-node-timeout (ms): short, so that fault
	// tests see a node marked failed within seconds.
	clusterNodeTimeout = 2000
	// clusterReadyTimeout bounds the wait for a consistent, healthy cluster.
	clusterReadyTimeout = 60 * time.Second
)

// ClusterOption configures RedisCluster.
type ClusterOption func(*clusterConfig)

type clusterConfig struct {
	replicas   int
	args       []string
	tls        bool
	clientAuth bool
}

// WithClusterReplicas gives every master n replicas (default 0).
func WithClusterReplicas(n int) ClusterOption {
	return func(c *clusterConfig) { c.replicas = n }
}

// WithClusterArgs appends extra redis-server arguments to every node.
func WithClusterArgs(args ...string) ClusterOption {
	return func(c *clusterConfig) { c.args = append(c.args, args...) }
}

// WithClusterTLS makes every node serve TLS on a second port as well, with
// certificates of one new authority (Cluster.TLS), and speak TLS on the
// cluster bus and to its master (tls-cluster and tls-replication yes).
// CLUSTER SLOTS then names the nodes' TLS ports to a client on TLS and their
// plain ports to the others, such as the helpers' own clients. With
// clientAuth a client must present a certificate signed by the authority.
func WithClusterTLS(clientAuth bool) ClusterOption {
	return func(c *clusterConfig) { c.tls, c.clientAuth = true, clientAuth }
}

// Cluster is a Redis Cluster of three masters (and optional replicas) on
// loopback ports. Its methods are safe for concurrent use; those that fail the
// test must run on the test goroutine.
type Cluster struct {
	// Addrs are the addresses of the masters, in slot order: Addrs[i] is
	// Masters[i].Addr.
	Addrs []string
	// Masters[i] was assigned the i-th third of the hash slots at creation.
	Masters []*Redis
	// Replicas[i] are the replicas of Masters[i] (empty without
	// WithClusterReplicas).
	Replicas [][]*Redis
	// TLSAddrs are the masters' TLS addresses, in the order of Addrs, and
	// TLS the certificates every node serves (WithClusterTLS; empty
	// otherwise).
	TLSAddrs []string
	TLS      *TLSFiles

	t      testing.TB
	mu     sync.Mutex
	client *redis.ClusterClient
}

// RedisCluster starts a three-master Redis Cluster (cluster-enabled yes,
// cluster-node-timeout 2000 ms, persistence off), assigns the slots and joins
// the nodes from Go, and waits until every node reports cluster_state:ok and
// all nodes agree on the slot map. Everything is stopped when the test ends.
func RedisCluster(t testing.TB, opts ...ClusterOption) *Cluster {
	t.Helper()
	var cfg clusterConfig
	for _, o := range opts {
		o(&cfg)
	}
	bin := redisServerBinary(t)
	c := &Cluster{t: t, Replicas: make([][]*Redis, clusterMasters)}
	t.Cleanup(c.cleanup)
	args := cfg.args
	if cfg.tls {
		c.TLS = NewTLSFiles(t)
		args = append([]string{"--tls-cluster", "yes", "--tls-replication", "yes"}, args...)
	}

	start := func(name string) *Redis {
		return startNode(t, nodeSpec{
			name: name,
			bin:  bin,
			args: func(port int, dir string) ([]string, error) {
				bus, err := freePort()
				if err != nil {
					return nil, fmt.Errorf("find a free cluster bus port: %w", err)
				}
				nodeArgs := append(baseRedisArgs(port, dir),
					"--cluster-enabled", "yes",
					"--cluster-config-file", "nodes.conf",
					"--cluster-node-timeout", strconv.Itoa(clusterNodeTimeout),
					"--cluster-port", strconv.Itoa(bus),
					// CLUSTER SLOTS lists a replica only once its replication
					// offset is non-zero, which on an idle master takes one
					// replica ping period (default 10 s).
					"--repl-ping-replica-period", "1",
				)
				return append(nodeArgs, args...), nil
			},
			tls:        c.TLS,
			clientAuth: cfg.clientAuth,
		})
	}
	for i := 0; i < clusterMasters; i++ {
		m := start(fmt.Sprintf("cluster-master-%d", i))
		c.Masters = append(c.Masters, m)
		c.Addrs = append(c.Addrs, m.Addr)
		if c.TLS != nil {
			c.TLSAddrs = append(c.TLSAddrs, m.TLSAddr)
		}
		for j := 0; j < cfg.replicas; j++ {
			c.Replicas[i] = append(c.Replicas[i], start(fmt.Sprintf("cluster-replica-%d-%d", i, j)))
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	if err := c.create(ctx); err != nil {
		t.Fatalf("testenv: create cluster: %v", err)
	}
	if err := c.waitHealthy(ctx); err != nil {
		t.Fatalf("testenv: cluster not healthy: %v", err)
	}
	return c
}

// create assigns slots and epochs, joins every node and attaches replicas.
func (c *Cluster) create(ctx context.Context) error {
	for i, m := range c.Masters {
		cl := m.Client()
		if err := cl.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER SET-CONFIG-EPOCH: %w", m.Addr, err)
		}
		first, last := slotRange(i)
		if err := cl.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", first, last).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER ADDSLOTSRANGE %d %d: %w", m.Addr, first, last, err)
		}
	}
	nodes := c.Nodes()
	seed := nodes[0].Client()
	for _, n := range nodes[1:] {
		bus, err := busPort(ctx, n)
		if err != nil {
			return err
		}
		if err := seed.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", n.Port, bus).Err(); err != nil {
			return fmt.Errorf("CLUSTER MEET %s: %w", n.Addr, err)
		}
	}
	// Every node must know every other before a replica can name its master.
	if err := poll(ctx, func() error {
		for _, n := range nodes {
			out, err := n.Client().Do(ctx, "CLUSTER", "NODES").Text()
			if err != nil {
				return fmt.Errorf("%s: CLUSTER NODES: %w", n.Addr, err)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != len(nodes) || strings.Contains(out, "handshake") {
				return fmt.Errorf("%s knows %d of %d nodes:\n%s", n.Addr, len(lines), len(nodes), out)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for i, m := range c.Masters {
		if len(c.Replicas[i]) == 0 {
			continue
		}
		id, err := m.Client().Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER MYID: %w", m.Addr, err)
		}
		for _, r := range c.Replicas[i] {
			if err := r.Client().Do(ctx, "CLUSTER", "REPLICATE", id).Err(); err != nil {
				return fmt.Errorf("%s: CLUSTER REPLICATE %s: %w", r.Addr, id, err)
			}
		}
	}
	return nil
}

// waitHealthy waits until every node says cluster_state:ok and reports the
// same slot map with the expected masters and replicas, and every replica's
// link to its master is up. With WithClusterTLS every node must also name
// the TLS addresses to a client on TLS: a node shows the port a peer was
// met on until that peer's first ping tells it the TLS one.
func (c *Cluster) waitHealthy(ctx context.Context) error {
	want, wantTLS := c.expectedSlots(func(n *Redis) string { return n.Addr }), []string(nil)
	tlsClients := map[*Redis]*redis.Client{}
	if c.TLS != nil {
		wantTLS = c.expectedSlots(func(n *Redis) string { return n.TLSAddr })
		cfg, err := c.TLS.ClientConfig()
		if err != nil {
			return err
		}
		for _, n := range c.Nodes() {
			tlsClients[n] = redis.NewClient(&redis.Options{Addr: n.TLSAddr, TLSConfig: cfg, MaxRetries: -1})
		}
		defer func() {
			for _, cl := range tlsClients {
				_ = cl.Close()
			}
		}()
	}
	return poll(ctx, func() error {
		for _, n := range c.Nodes() {
			info, err := n.Client().ClusterInfo(ctx).Result()
			if err != nil {
				return fmt.Errorf("%s: CLUSTER INFO: %w", n.Addr, err)
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("%s: cluster not ok:\n%s", n.Addr, info)
			}
			got, err := slotMap(ctx, n)
			if err != nil {
				return err
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("%s: slot map %v, want %v", n.Addr, got, want)
			}
			if cl := tlsClients[n]; cl != nil {
				got, err := clientSlotMap(ctx, cl)
				if err != nil {
					return err
				}
				if !slices.Equal(got, wantTLS) {
					return fmt.Errorf("%s: slot map over TLS %v, want %v", n.TLSAddr, got, wantTLS)
				}
			}
		}
		for _, rs := range c.Replicas {
			for _, r := range rs {
				info, err := r.Client().Info(ctx, "replication").Result()
				if err != nil {
					return fmt.Errorf("%s: INFO replication: %w", r.Addr, err)
				}
				if !strings.Contains(info, "master_link_status:up") {
					return fmt.Errorf("%s: replica link not up:\n%s", r.Addr, info)
				}
			}
		}
		return nil
	})
}

// WaitHealthy waits until every running node reports cluster_state:ok and
// all running nodes agree on a slot map whose masters are all running, e.g.
// after a killed node was started again with Start (it keeps its node ID:
// nodes.conf lives in its directory). Unlike the check at creation it accepts
// any such map, so it also holds after a replica took over a master's slots.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	return poll(ctx, func() error {
		var first []string
		var firstAddr string
		for _, n := range c.Nodes() {
			if !n.Running() {
				continue
			}
			info, err := n.Client().ClusterInfo(ctx).Result()
			if err != nil {
				return fmt.Errorf("%s: CLUSTER INFO: %w", n.Addr, err)
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("%s: cluster not ok", n.Addr)
			}
			got, err := slotMap(ctx, n)
			if err != nil {
				return err
			}
			if first == nil {
				first, firstAddr = got, n.Addr
				if err := c.checkOwners(ctx, n); err != nil {
					return err
				}
				continue
			}
			if !slices.Equal(got, first) {
				return fmt.Errorf("%s sees %v, %s sees %v", n.Addr, got, firstAddr, first)
			}
		}
		if first == nil {
			return fmt.Errorf("no cluster node is running")
		}
		return nil
	})
}

// checkOwners fails unless every slot, as n sees it, belongs to a running
// master of this cluster.
func (c *Cluster) checkOwners(ctx context.Context, n *Redis) error {
	slots, err := n.Client().ClusterSlots(ctx).Result()
	if err != nil {
		return fmt.Errorf("%s: CLUSTER SLOTS: %w", n.Addr, err)
	}
	covered := 0
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			return fmt.Errorf("%s: slots %d-%d have no node", n.Addr, s.Start, s.End)
		}
		owner := c.Node(s.Nodes[0].Addr)
		if owner == nil || !owner.Running() {
			return fmt.Errorf("%s: slots %d-%d owned by %s, which is not running", n.Addr, s.Start, s.End, s.Nodes[0].Addr)
		}
		covered += int(s.End-s.Start) + 1
	}
	if covered != clusterSlots {
		return fmt.Errorf("%s: %d of %d slots covered", n.Addr, covered, clusterSlots)
	}
	return nil
}

// expectedSlots renders the slot map as slotMap does, from the creation
// plan, naming each node by addr.
func (c *Cluster) expectedSlots(addr func(*Redis) string) []string {
	var out []string
	for i, m := range c.Masters {
		first, last := slotRange(i)
		addrs := []string{addr(m)}
		for _, r := range c.Replicas[i] {
			addrs = append(addrs, addr(r))
		}
		slices.Sort(addrs[1:])
		out = append(out, fmt.Sprintf("%d-%d:%s", first, last, strings.Join(addrs, ",")))
	}
	slices.Sort(out)
	return out
}

// slotMap returns n's view of the cluster as sorted
// "first-last:master,replica..." strings (replicas sorted).
func slotMap(ctx context.Context, n *Redis) ([]string, error) {
	return clientSlotMap(ctx, n.Client())
}

// clientSlotMap is slotMap of the node cl is connected to.
func clientSlotMap(ctx context.Context, cl *redis.Client) ([]string, error) {
	slots, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("%s: CLUSTER SLOTS: %w", cl.Options().Addr, err)
	}
	var out []string
	for _, s := range slots {
		var addrs []string
		for _, node := range s.Nodes {
			addrs = append(addrs, node.Addr)
		}
		if len(addrs) > 1 {
			slices.Sort(addrs[1:])
		}
		out = append(out, fmt.Sprintf("%d-%d:%s", s.Start, s.End, strings.Join(addrs, ",")))
	}
	slices.Sort(out)
	return out, nil
}

func busPort(ctx context.Context, n *Redis) (int, error) {
	v, err := n.Client().ConfigGet(ctx, "cluster-port").Result()
	if err != nil {
		return 0, fmt.Errorf("%s: CONFIG GET cluster-port: %w", n.Addr, err)
	}
	port, err := strconv.Atoi(v["cluster-port"])
	if err != nil || port == 0 {
		return n.Port + 10000, nil
	}
	return port, nil
}

// slotRange returns the first and last slot assigned to master i.
func slotRange(i int) (first, last int) {
	return i * clusterSlots / clusterMasters, (i+1)*clusterSlots/clusterMasters - 1
}

// Client returns a go-redis cluster client seeded with Addrs, created on first
// use and closed when the test ends.
func (c *Cluster) Client() *redis.ClusterClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client == nil {
		c.client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	}
	return c.client
}

// Nodes returns every node: the masters, then the replicas.
func (c *Cluster) Nodes() []*Redis {
	nodes := slices.Clone(c.Masters)
	for _, rs := range c.Replicas {
		nodes = append(nodes, rs...)
	}
	return nodes
}

// Node returns the node listening on addr, or nil.
func (c *Cluster) Node(addr string) *Redis {
	for _, n := range c.Nodes() {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// MasterForKey returns the node that currently serves key's hash slot, as
// reported by CLUSTER SLOTS on the first running node that answers (so it
// follows a failover to a replica).
func (c *Cluster) MasterForKey(key string) *Redis {
	c.t.Helper()
	slot := Slot(key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var lastErr error
	for _, n := range c.Nodes() {
		if !n.Running() {
			continue
		}
		slots, err := n.Client().ClusterSlots(ctx).Result()
		if err != nil {
			lastErr = err
			continue
		}
		for _, s := range slots {
			if int(s.Start) <= slot && slot <= int(s.End) && len(s.Nodes) > 0 {
				if owner := c.Node(s.Nodes[0].Addr); owner != nil {
					return owner
				}
			}
		}
		lastErr = fmt.Errorf("%s: no owner of slot %d in CLUSTER SLOTS", n.Addr, slot)
	}
	c.t.Fatalf("testenv: owner of key %q (slot %d): %v", key, slot, lastErr)
	return nil
}

func (c *Cluster) cleanup() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil {
		_ = c.client.Close()
		c.client = nil
	}
}

// Slot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of the key,
// or of its hash tag (the non-empty text between the first '{' and the next
// '}'), modulo 16384.
func Slot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	return int(crc16(key)) % clusterSlots
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), as used by
// Redis Cluster.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// poll calls f until it returns nil or ctx ends; the error then wraps the last
// failure of f.
func poll(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last: %v", ctx.Err(), err)
		case <-time.After(pollInterval * 5):
		}
	}
}
