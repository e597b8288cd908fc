package descriptors

// STUB: the descriptors helper replaces this file with the real implementation.
// The exported signatures below are the contract pkg/rls and cmd/envoy-rls use.

// Options tunes loading. The zero value is the default.
type Options struct {
	// MergeDomains lets several files declare the same domain; their
	// descriptors are merged. Off by default: a duplicate domain is an error.
	MergeDomains bool
}

// Config is a compiled, immutable set of domains. Safe for concurrent use.
type Config struct{}

// Load reads every *.yaml / *.yml file in dir (not recursive, hidden files
// and Kubernetes ..data dirs handled), parses, validates and compiles them.
// The error lists every problem with file:line:col.
func Load(dir string, opts Options) (*Config, error) { return &Config{}, nil }

// Match returns the rule for one request descriptor in domain, or nil.
func (c *Config) Match(domain string, entries []Entry) *Rule { return nil }

// HasDomain reports whether domain is configured.
func (c *Config) HasDomain(domain string) bool { return false }

// Domains summarises the loaded domains, sorted by name.
func (c *Config) Domains() []DomainSummary { return nil }
