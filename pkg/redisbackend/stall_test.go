package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// stallProxy forwards loopback connections to a Redis server. Once armed,
// it stalls the next connection on which a client sends anything: from then
// on what the client sends on it is read and dropped, never reaching Redis,
// and nothing comes back, as on a connection whose packets are lost. Armed
// with armLoss instead, it lets that command through and loses its reply:
// the connection breaks once Redis has answered, as when the network fails
// between Redis and the client. The other connections, and the ones opened
// later, go on working. Made by newDelayProxy, it holds every reply for a
// fixed delay instead (not armed then).
type stallProxy struct {
	ln      net.Listener
	target  string
	delay   time.Duration // replies held this long (newDelayProxy)
	armed   atomic.Bool
	stalled chan struct{} // one value per connection stalled
	loss    atomic.Bool
	lost    chan struct{} // one value per reply lost

	mu     sync.Mutex
	conns  []net.Conn // both ends of every proxied connection
	frozen []net.Conn // client ends of the stalled ones
	closed bool
	wg     sync.WaitGroup
}

// newStallProxy starts a proxy to target on a free loopback port, stopped
// when the test ends.
func newStallProxy(tb testing.TB, target string) *stallProxy {
	return newDelayProxy(tb, target, 0)
}

// newDelayProxy starts a proxy to target on a free loopback port that holds
// every chunk of the server's replies for delay before it passes it on, in
// order (a Redis that many network hops away), stopped when the test ends.
func newDelayProxy(tb testing.TB, target string, delay time.Duration) *stallProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target, delay: delay, stalled: make(chan struct{}, 16), lost: make(chan struct{}, 16)}
	p.wg.Go(p.accept)
	tb.Cleanup(p.close)
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

// arm makes the next connection that carries a command stall.
func (p *stallProxy) arm() { p.armed.Store(true) }

// armLoss makes the next command reach Redis and its reply get lost.
func (p *stallProxy) armLoss() { p.loss.Store(true) }

// cut closes the stalled connections: their clients see them break.
func (p *stallProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.frozen {
		_ = c.Close()
	}
	p.frozen = nil
}

func (p *stallProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		var mute atomic.Bool // the next reply is lost
		p.wg.Go(func() {
			if p.delay > 0 {
				p.backDelayed(client, server)
			} else {
				p.back(client, server, &mute)
			}
			_ = client.Close()
		})
		p.wg.Go(func() {
			p.forward(client, server, &mute)
			_ = server.Close()
		})
	}
}

// back copies server to client until the connection ends or a reply is to
// be lost: then it drops the reply, closes the client's end and reports it.
func (p *stallProxy) back(client, server net.Conn, mute *atomic.Bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 && mute.Load() {
			_ = client.Close()
			p.lost <- struct{}{}
			return
		}
		if n > 0 {
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// backDelayed copies server to client, each chunk p.delay after it arrived,
// until the connection ends.
func (p *stallProxy) backDelayed(client, server net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	ch := make(chan chunk, 4096)
	p.wg.Go(func() {
		for c := range ch {
			time.Sleep(time.Until(c.due))
			if _, err := client.Write(c.b); err != nil {
				for range ch { // drain until the reader stops
				}
				return
			}
		}
	})
	defer close(ch)
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			ch <- chunk{b: slices.Clone(buf[:n]), due: time.Now().Add(p.delay)}
		}
		if err != nil {
			return
		}
	}
}

// forward copies client to server until the connection ends or stalls.
func (p *stallProxy) forward(client, server net.Conn, mute *atomic.Bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 && p.loss.CompareAndSwap(true, false) {
			mute.Store(true)
		}
		if n > 0 && p.armed.CompareAndSwap(true, false) {
			p.mu.Lock()
			p.frozen = append(p.frozen, client)
			p.mu.Unlock()
			p.stalled <- struct{}{}
			_, _ = io.Copy(io.Discard, client) // until the client or cut closes it
			return
		}
		if n > 0 {
			if _, werr := server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestStalledConnection: a coalescing slot whose connection stalls (its
// command never reaches Redis, no reply comes) holds only its own call.
//
// With two slots, Checks that arrive meanwhile go out on the other slot and
// are decided while the stalled call is still waiting; when the stalled
// connection breaks, that call fails with limiter.ErrUnavailable and the
// Backend goes on working.
//
// With two slots of which the second is a spare opened after 10 ms
// (Options.SpareAfter), the same: the first Check that arrives meanwhile
// waits those 10 ms, then the spare timer lends it the other slot, and the
// next ones go out on it at once, counted as spare calls.
//
// With one slot, a Check that arrives meanwhile queues behind the stalled
// call; when that call's deadline passes the slot gives up its connection
// (which stays stalled) and the queued Check is sent on a fresh one and
// decided. If the slot kept the stalled connection, the queued Check would
// never be answered and would fail at its own deadline.
//
// Either way nothing is lost or counted twice: the stalled Check's hit never
// reached Redis, and every other Check counted exactly once.
func TestStalledConnection(t *testing.T) {
	r := testenv.RedisServer(t)
	p := newStallProxy(t, r.Addr)
	limit := limiter.Limit{Requests: 1000, Window: time.Hour}
	for _, tc := range []struct {
		senders    int
		spareAfter time.Duration
	}{{2, 0}, {2, 10 * time.Millisecond}, {1, 0}} {
		senders := tc.senders
		t.Run(fmt.Sprintf("senders=%d spare-after=%v", senders, tc.spareAfter), func(t *testing.T) {
			b, err := New(Options{URL: "redis://" + p.addr(), KeyPrefix: fmt.Sprintf("stall%d-%d:", senders, tc.spareAfter), Timeout: testTimeout, Senders: senders, SpareAfter: tc.spareAfter})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			stalledReq := []limiter.Request{{Key: key("stalled"), Limit: limit, Hits: 1}}
			otherReq := []limiter.Request{{Key: key("other"), Limit: limit, Hits: 1}}
			check := func(ctx context.Context, req []limiter.Request) error {
				return b.Check(ctx, req, make([]limiter.Result, len(req)))
			}
			if err := check(context.Background(), otherReq); err != nil { // loads the library
				t.Fatal(err)
			}
			others := 1

			stalledCtx := context.Background()
			if senders == 1 {
				// The stalled call ends at this deadline; long enough for
				// the next Check to queue behind it.
				var cancel context.CancelFunc
				stalledCtx, cancel = context.WithTimeout(stalledCtx, time.Second)
				defer cancel()
			}
			p.arm()
			stalledDone := make(chan error, 1)
			go func() { stalledDone <- check(stalledCtx, stalledReq) }()
			<-p.stalled

			if senders == 2 {
				for range 5 {
					if err := check(context.Background(), otherReq); err != nil {
						t.Fatalf("Check while the other slot's connection is stalled: %v", err)
					}
					others++
				}
				select {
				case err := <-stalledDone:
					t.Fatalf("the stalled Check returned (%v) while its connection is stalled", err)
				default:
				}
				if n := b.CallStats().SpareCalls; n < 5 {
					t.Errorf("%d calls started beside the stalled one, want at least 5", n)
				}
				p.cut()
				if err := <-stalledDone; !errors.Is(err, limiter.ErrUnavailable) {
					t.Fatalf("the stalled Check = %v, want ErrUnavailable", err)
				}
			} else {
				queuedDone := make(chan error, 1)
				go func() { queuedDone <- check(context.Background(), otherReq) }()
				if err := waitFor(func() error {
					if n, _ := b.co.occupancy(); n != 1 {
						return fmt.Errorf("%d Checks queued, want 1", n)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				if err := <-stalledDone; !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("the stalled Check = %v, want ErrUnavailable and DeadlineExceeded", err)
				}
				if err := <-queuedDone; err != nil {
					t.Fatalf("the Check queued behind the stalled call: %v, want it sent on a fresh connection", err)
				}
				others++
			}

			// Every slot works again: concurrent Checks all succeed.
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for range 8 {
				wg.Go(func() { errs <- check(context.Background(), otherReq) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Errorf("Check after the stall: %v", err)
					continue
				}
				others++
			}
			if got := used(t, b, stalledReq[0]); got != 0 {
				t.Errorf("the stalled Check's counter has %d hits, want 0 (its command never reached Redis)", got)
			}
			if got := used(t, b, otherReq[0]); got != int64(others) {
				t.Errorf("the other counter has %d hits, want %d", got, others)
			}
		})
	}
}

// newRetrying returns a Backend through p on a client that retries a
// command up to 3 times after a network error (NewFromClient), with
// coalescing off (Senders -1) so that every call takes a pooled connection,
// where a retry would take a fresh one. Both close when the test ends.
func newRetrying(t *testing.T, p *stallProxy) *Backend {
	t.Helper()
	client := redis.NewClient(&redis.Options{
		Addr: p.addr(), Protocol: 2, MaxRetries: 3, ContextTimeoutEnabled: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { client.Close() })
	b, err := NewFromClient(client, Options{Timeout: testTimeout, Senders: -1})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestLostReplyNotResent: a check whose reply is lost after Redis ran it is
// not sent again, even by a client configured to retry (NewFromClient with
// MaxRetries 3; a Cluster client resends after a connection error whatever
// its MaxRetries): the Check fails with limiter.ErrUnavailable and its hit is
// counted once. Resent, it would succeed and count twice.
func TestLostReplyNotResent(t *testing.T) {
	r := testenv.RedisServer(t)
	p := newStallProxy(t, r.Addr)
	b := newRetrying(t, p)
	limit := limiter.Limit{Requests: 1000, Window: time.Hour}
	warm := []limiter.Request{{Key: key("warm-up"), Limit: limit, Hits: 1}}
	if err := b.Check(context.Background(), warm, make([]limiter.Result, 1)); err != nil { // loads the library
		t.Fatal(err)
	}
	req := []limiter.Request{{Key: key("lost"), Limit: limit, Hits: 1}}
	p.armLoss()
	err := b.Check(context.Background(), req, make([]limiter.Result, 1))
	<-p.lost
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Check whose reply was lost = %v, want ErrUnavailable (not resent)", err)
	}
	if got := used(t, b, req[0]); got != 1 {
		t.Errorf("%d hits counted for one Check whose reply was lost, want 1", got)
	}
}

// TestLostRefundNotResent: a Cluster refund (refund.lua) whose reply is lost
// after Redis ran it is not sent again by a client configured to retry. Run
// twice, it would take back twice the hits and let later Checks past the
// limit. (The refund path is exercised on a single node here: the proxy sits
// in front of one server.)
func TestLostRefundNotResent(t *testing.T) {
	r := testenv.RedisServer(t)
	p := newStallProxy(t, r.Addr)
	b := newRetrying(t, p)
	ctx := context.Background()
	if err := b.scripts.refund.Load(ctx, r.Client()).Err(); err != nil { // so that EVALSHA runs it
		t.Fatal(err)
	}
	reqs := []limiter.Request{{Key: key("refunded"), Limit: limiter.Limit{Requests: 1000, Window: time.Hour}, Hits: 1}}
	results := make([]limiter.Result, 1)
	var c slotCall
	for range 5 {
		c.now, c.committed, c.err = b.call(ctx, reqs, nil, results, nil)
		if c.err != nil || !c.committed || !results[0].Allowed {
			t.Fatalf("check: err %v, committed %v, %+v", c.err, c.committed, results[0])
		}
	}
	c.idx = []int{0}
	p.armLoss()
	err := b.refundSlot(ctx, reqs, &c, results)
	<-p.lost
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("refund whose reply was lost = %v, want ErrUnavailable (not resent)", err)
	}
	if got := used(t, b, reqs[0]); got != 4 {
		t.Errorf("%d hits counted after 5 admitted and 1 refunded, want 4", got)
	}
}
