package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"
)

// topMain prints the heaviest denied descriptor values of a running
// envoy-rls, read from its /debug/top on the debug listener.
func topMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:6070", "envoy-rls debug address (--debug.addr of the server)")
	n := fs.Int("n", 10, "values to show per limit")
	domain := fs.String("domain", "", "only this domain")
	rule := fs.String("rule", "", "only this rule")
	reset := fs.Bool("reset", false, "after printing, reset the server's counts (DELETE /debug/top)")
	raw := fs.Bool("json", false, "print the server's JSON as is")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline of each HTTP request")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: envoy-rls top [--addr HOST:PORT] [--n N] [--domain D] [--rule R] [--json] [--reset] [--timeout D]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return parseError(err)
	}
	if fs.NArg() > 0 {
		return usageError{msg: fmt.Sprintf("top takes no arguments, got %q", fs.Args())}
	}
	if *n < 1 {
		return usageError{msg: "--n must be at least 1"}
	}
	if *timeout <= 0 {
		return usageError{msg: fmt.Sprintf("--timeout %v: must be positive", *timeout)}
	}
	q := url.Values{"n": {strconv.Itoa(*n)}}
	if *domain != "" {
		q.Set("domain", *domain)
	}
	if *rule != "" {
		q.Set("rule", *rule)
	}
	u := "http://" + *addr + "/debug/top"
	client := &http.Client{Timeout: *timeout}
	body, err := httpDo(client, http.MethodGet, u+"?"+q.Encode())
	if err != nil {
		return err
	}
	if *raw {
		if _, err := stdout.Write(body); err != nil {
			return err
		}
	} else {
		var rep topReport
		if err := json.Unmarshal(body, &rep); err != nil {
			return fmt.Errorf("%s: %w", u, err)
		}
		if err := printTop(stdout, rep); err != nil {
			return err
		}
	}
	if *reset {
		if _, err := httpDo(client, http.MethodDelete, u); err != nil {
			return err
		}
		fmt.Fprintln(stderr, "envoy-rls top: counts reset")
	}
	return nil
}

func httpDo(client *http.Client, method, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(context.Background(), method, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w (is envoy-rls serving its debug listener there? see --debug.addr)", method, u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, u, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: %s: %s", method, u, resp.Status, body)
	}
	return body, nil
}

// printTop writes rep as one table per limit, for example:
//
//	denied descriptor values since 2030-01-01T00:00:00Z (values cut to 8 bytes + hash; --debug.top-full-values shows them whole)
//
//	edge / per_ip / per_ip (over_limit): 1200 denied, 3 values monitored, counts at most 18 too high
//	  #  DENIED  ±   SHARE   VALUE
//	  1  1000    0   83.3%   remote_address=10.0.0.1~1c4e2a7b
func printTop(w io.Writer, rep topReport) error {
	mode := "values cut to 8 bytes + hash; --debug.top-full-values shows them whole"
	if rep.FullValues {
		mode = "whole values"
	}
	fmt.Fprintf(w, "denied descriptor values since %s (%s)\n", rep.Since.UTC().Format(time.RFC3339), mode)
	if len(rep.Limits) == 0 {
		fmt.Fprintln(w, "\nno denials")
	}
	for _, l := range rep.Limits {
		fmt.Fprintf(w, "\n%s / %s / %s (%s): %d denied, %d values monitored, counts at most %d too high\n",
			l.Domain, l.Rule, l.Limit, l.Outcome, l.Denied, l.Monitored, l.ErrorBound)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  #\tDENIED\t±\tSHARE\tVALUE")
		for i, it := range l.Top {
			share := 0.0
			if l.Denied > 0 {
				share = 100 * float64(it.Count) / float64(l.Denied)
			}
			fmt.Fprintf(tw, "  %d\t%d\t%d\t%.1f%%\t%s\n", i+1, it.Count, it.Error, share, it.Key)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if rep.Dropped > 0 {
		fmt.Fprintf(w, "\n%d denials not tracked: too many limits\n", rep.Dropped)
	}
	return nil
}
