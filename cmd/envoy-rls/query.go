package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
	"github.com/envoy-rls/envoy-rls/pkg/rls"
)

// descriptorFlag collects --descriptor k=v[,k=v...] values, one descriptor each.
type descriptorFlag []*commonrl.RateLimitDescriptor

func (d *descriptorFlag) String() string { return fmt.Sprint(len(*d), " descriptors") }

func (d *descriptorFlag) Set(s string) error {
	desc := &commonrl.RateLimitDescriptor{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q: want key=value[,key=value...]", s)
		}
		desc.Entries = append(desc.Entries, &commonrl.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	*d = append(*d, desc)
	return nil
}

// queryMain sends ShouldRateLimit count times and prints every answer.
func queryMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("query", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "envoy-rls gRPC address: host:port, or unix:/path for a --grpc.addr socket")
	domain := fs.String("domain", "edge", "rate-limit domain")
	hits := fs.Uint("hits", 0, "hits_addend of the request (0: Envoy's default of 1)")
	count := fs.Int("count", 1, "how many identical requests to send")
	timeout := fs.Duration("timeout", 2*time.Second, "deadline of each request")
	var tlsFlags tlsfiles.ClientFlags
	tlsFlags.Register(fs, "server")
	var descs descriptorFlag
	fs.Var(&descs, "descriptor", "a descriptor as key=value[,key=value...]; repeat for several")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: envoy-rls query [--addr HOST:PORT|unix:/PATH] [--domain D] --descriptor k=v[,k=v...] [--descriptor ...] [--hits N] [--count N] [--tls --tls.ca F ...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return parseError(err)
	}
	if fs.NArg() > 0 {
		return usageError{msg: fmt.Sprintf("query takes flags only, got %q", fs.Args())}
	}
	if len(descs) == 0 {
		fs.Usage()
		return usageError{msg: "query needs at least one --descriptor"}
	}
	if *hits > math.MaxUint32 {
		return usageError{msg: fmt.Sprintf("--hits %d: at most %d (hits_addend is 32 bits)", *hits, uint32(math.MaxUint32))}
	}
	if *count < 1 {
		return usageError{msg: "--count must be at least 1"}
	}
	tlsCfg, err := tlsFlags.Config()
	if err != nil {
		return usageError{msg: err.Error()}
	}
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("--addr %s: %w", *addr, err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: *domain, Descriptors: descs, HitsAddend: uint32(*hits)}
	for i := 1; i <= *count; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		resp, err := client.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		if *count > 1 {
			fmt.Fprintf(stdout, "#%d ", i)
		}
		rls.FormatResponse(stdout, resp)
	}
	return nil
}
