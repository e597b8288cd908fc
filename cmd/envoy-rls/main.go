// Command envoy-rls is an Envoy rate-limit service (RateLimitService v3)
// that counts in Redis with atomic Lua scripts, or in process when no Redis
// is configured.
//
// Usage:
//
//	envoy-rls [serve] [flags]          run the service (the default)
//	envoy-rls check-config PATH...     validate descriptor folders or files
//	envoy-rls query [flags]            send ShouldRateLimit and print the answer
//	envoy-rls top [flags]              print the most denied descriptor values
//	envoy-rls version                  print the version
//
// Every serve flag can also be set through an environment variable:
// ENVOY_RLS_ followed by the flag name upper-cased with '.' and '-' as '_',
// e.g. --redis.url is ENVOY_RLS_REDIS_URL. A command-line flag wins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv))
}

// run dispatches a subcommand and returns the process exit code: 0 on
// success, 1 on a failure (invalid config, unreachable server), 2 on usage
// errors.
func run(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "serve":
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err = serveMain(ctx, args, stderr, lookupEnv)
	case "check-config":
		err = checkConfigMain(args, stdout, stderr)
	case "query":
		err = queryMain(args, stdout, stderr)
	case "top":
		err = topMain(args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "envoy-rls", version)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, topUsage)
	default:
		fmt.Fprintf(stderr, "envoy-rls: unknown command %q\n\n%s", cmd, topUsage)
		return 2
	}
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		if ue.msg != "" {
			fmt.Fprintln(stderr, "envoy-rls:", ue.msg)
		}
		return 2
	default:
		fmt.Fprintln(stderr, "envoy-rls:", err)
		return 1
	}
}

const topUsage = `Usage:
  envoy-rls [serve] [flags]          run the service (default; see envoy-rls serve -h)
  envoy-rls check-config PATH...     validate descriptor folders or files
  envoy-rls query [flags]            send ShouldRateLimit to a server and print the answer
  envoy-rls top [flags]              print the most denied descriptor values (from --debug.addr)
  envoy-rls version                  print the version
`

// usageError marks a command-line mistake (exit code 2). An empty msg means
// the usage was already printed (for example after -h).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// parseError turns a flag parsing error into the command's result: -h is a
// success (the usage was printed), anything else a usage error (the flag
// package printed what was wrong).
func parseError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return usageError{}
}
