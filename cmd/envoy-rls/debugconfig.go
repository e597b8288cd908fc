package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
)

// writeConfig prints the loaded configuration for /debug/config: per
// domain, every rule and limit with its identity, algorithm, rate, failure
// mode and the file:line:col it comes from.
func writeConfig(w io.Writer, cfg *descriptors.Config) {
	fmt.Fprintf(w, "config %s\n", cfg.Digest())
	for _, d := range cfg.Domains() {
		fmt.Fprintf(w, "\ndomain %s (%s): %d rules, %d limits\n", d.Domain, d.File, d.Rules, d.Limits)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tNAME\tALGORITHM\tRATE\tFAILURE\tFLAGS\tAT")
		for _, r := range cfg.Rules(d.Domain) {
			var flags []string
			if r.ShadowMode {
				flags = append(flags, "shadow")
			}
			if len(r.Replaces) > 0 {
				flags = append(flags, "replaces "+strings.Join(r.Replaces, ","))
			}
			flagText := strings.Join(flags, " ")
			if flagText == "" {
				flagText = "-"
			}
			if r.Unlimited {
				fmt.Fprintf(tw, "  %s\t%s\tunlimited\t-\t-\t%s\t%s\n", r.ID, r.Name, flagText, r.Pos)
				continue
			}
			for _, l := range r.Limits {
				rate := fmt.Sprintf("%d/%v", l.Limit.Requests, l.Limit.Window)
				if l.Blocked() {
					rate = "blocked"
				} else if l.Limit.Burst > 0 {
					rate += fmt.Sprintf(" burst %d", l.Limit.Burst)
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.ID, l.Name, l.Limit.Algorithm, rate, l.FailureMode, flagText, l.Pos)
			}
		}
		tw.Flush()
	}
}
