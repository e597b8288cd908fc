package main

import (
	"flag"
	"fmt"
	"strings"
)

// envName is the environment variable that backs the flag called name:
// ENVOY_RLS_ followed by the name upper-cased, with '.' and '-' as '_'
// (--redis.url → ENVOY_RLS_REDIS_URL).
func envName(name string) string {
	return "ENVOY_RLS_" + strings.NewReplacer(".", "_", "-", "_").Replace(strings.ToUpper(name))
}

// applyEnv sets every flag of fs that was not given on the command line from
// its environment variable, when that is set. A command-line flag always
// wins. An environment value the flag rejects is an error naming the variable.
func applyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []string
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		v, ok := lookup(envName(f.Name))
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Sprintf("%s=%q: %v", envName(f.Name), v, err))
		}
	})
	if len(errs) > 0 {
		return fmt.Errorf("bad environment: %s", strings.Join(errs, "; "))
	}
	return nil
}

// usageWithEnv prints the flags of fs with the environment variable of each.
func usageWithEnv(fs *flag.FlagSet, synopsis string) func() {
	return func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: %s\n\nFlags (each also read from the environment variable shown):\n", synopsis)
		fs.VisitAll(func(f *flag.Flag) {
			def := ""
			if f.DefValue != "" {
				def = fmt.Sprintf(" (default %q)", f.DefValue)
			}
			fmt.Fprintf(w, "  --%s%s\n        %s  [$%s]\n", f.Name, def, f.Usage, envName(f.Name))
		})
	}
}
