package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisUse is what the Redis servers behind the target did over the
// measured phase, from their INFO stats read before and after it: commands
// processed (a script's commands count, each one, besides the script) and
// read events (a client's read of what arrived on its connection: about one
// per round trip, whatever a pipeline or script carries), summed over the
// servers and per answered request. It says how many round trips a server
// makes to Redis per decision, which any server can be measured by. The
// two INFO commands are not counted; every other client's are, an idle
// one's keep-alive PINGs included, so nothing else should use the servers
// during the run.
type RedisUse struct {
	Servers        int     `json:"servers"`
	Commands       int64   `json:"commands"`
	Reads          int64   `json:"reads"`
	CommandsPerReq float64 `json:"commands_per_req"`
	ReadsPerReq    float64 `json:"reads_per_req"`
}

// redisStats are the counters of one INFO stats.
type redisStats struct{ commands, reads int64 }

// ParseRedisURL checks a Redis URL for Options.Redis (redis://, rediss://
// or unix://, as go-redis reads them).
func ParseRedisURL(u string) error {
	if _, err := redis.ParseURL(u); err != nil {
		return fmt.Errorf("redis stats %q: %w", u, err)
	}
	return nil
}

// redisProbes are open clients of the servers of Options.Redis, one
// connection each, so that every INFO after the first reuses it (a new
// connection's handshake would count as commands).
type redisProbes struct {
	urls    []string
	clients []*redis.Client
	timeout time.Duration
}

// openRedisProbes connects to each URL and reads INFO once, so that the
// connection exists before the measured phase.
func openRedisProbes(ctx context.Context, urls []string, timeout time.Duration) (*redisProbes, error) {
	p := &redisProbes{urls: urls, timeout: timeout}
	for _, u := range urls {
		opt, err := redis.ParseURL(u)
		if err != nil {
			p.close()
			return nil, fmt.Errorf("redis stats %q: %w", u, err)
		}
		opt.PoolSize, opt.MaxRetries = 1, -1
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = timeout, timeout, timeout
		p.clients = append(p.clients, redis.NewClient(opt))
	}
	if _, err := p.read(ctx); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *redisProbes) close() {
	for _, c := range p.clients {
		c.Close()
	}
}

// read returns every server's counters, in the order of the URLs.
func (p *redisProbes) read(ctx context.Context) ([]redisStats, error) {
	out := make([]redisStats, len(p.clients))
	for i, c := range p.clients {
		rctx, cancel := context.WithTimeout(ctx, p.timeout)
		info, err := c.Info(rctx, "stats").Result()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("redis stats %s: INFO stats: %w", p.urls[i], err)
		}
		if out[i], err = parseRedisStats(info); err != nil {
			return nil, fmt.Errorf("redis stats %s: %w", p.urls[i], err)
		}
	}
	return out, nil
}

// parseRedisStats reads total_commands_processed and total_reads_processed
// (Redis 6.0 and later) from INFO's text.
func parseRedisStats(info string) (redisStats, error) {
	var s redisStats
	found := 0
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch name {
		case "total_commands_processed":
			dst = &s.commands
		case "total_reads_processed":
			dst = &s.reads
		default:
			continue
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n < 0 {
			return s, fmt.Errorf("INFO stats: %s is %q, not a count", name, value)
		}
		*dst = n
		found++
	}
	if found != 2 {
		return s, errors.New("INFO stats lacks total_commands_processed or total_reads_processed (Redis 6.0 or later has both)")
	}
	return s, nil
}

// redisUseBetween is RedisUse between two readings of the same servers,
// per answered request; nil when a counter went back (a server restarted,
// or CONFIG RESETSTAT).
func redisUseBetween(before, after []redisStats, answered int64) *RedisUse {
	u := &RedisUse{Servers: len(before)}
	for i := range before {
		// Each server's delta holds the first INFO (counted once it has
		// run) and the second's read event (counted as it is read).
		dc, dr := after[i].commands-before[i].commands-1, after[i].reads-before[i].reads-1
		if dc < 0 || dr < 0 {
			return nil
		}
		u.Commands += dc
		u.Reads += dr
	}
	if answered > 0 {
		u.CommandsPerReq = float64(u.Commands) / float64(answered)
		u.ReadsPerReq = float64(u.Reads) / float64(answered)
	}
	return u
}
