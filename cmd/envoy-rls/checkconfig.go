package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
)

// checkConfigMain validates each PATH (a folder of descriptor files, or a
// single file) and prints one summary line per domain, or every error with
// its position.
func checkConfigMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check-config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	merge := fs.Bool("config.merge-domains", false, "allow several files to declare the same domain")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: envoy-rls check-config [--config.merge-domains] PATH...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return parseError(err)
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return usageError{msg: "check-config needs at least one PATH"}
	}
	failed := 0
	for _, path := range fs.Args() {
		cfg, err := loadPath(path, descriptors.Options{MergeDomains: *merge})
		if err != nil {
			fmt.Fprintln(stdout, err)
			failed++
			continue
		}
		for _, d := range cfg.Domains() {
			fmt.Fprintf(stdout, "%s: domain %q: %d rules, %d limits (%s)\n", path, d.Domain, d.Rules, d.Limits, d.File)
		}
		for _, w := range cfg.Warnings() {
			fmt.Fprintf(stdout, "%s: warning: %s\n", w.Pos, w.Msg)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d paths invalid", failed, fs.NArg())
	}
	return nil
}

// loadPath loads a folder, or a single file by loading a temporary folder
// that holds only a link to it, so errors still name the original path.
func loadPath(path string, opts descriptors.Options) (*descriptors.Config, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return descriptors.Load(path, opts)
	}
	return descriptors.LoadFiles([]string{path}, opts)
}
