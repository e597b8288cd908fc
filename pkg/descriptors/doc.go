// Package descriptors loads the rate-limit descriptor configuration: a
// folder of YAML files, one domain per file, in the vocabulary of
// github.com/envoyproxy/ratelimit (so its users' files load unchanged) plus
// the extensions of envoy-rls. Load parses, validates and compiles the files
// into an immutable *Config; Config.Match selects the Rule of a request
// descriptor; a Watcher reloads the folder when it changes, keeping the last
// good Config when a new one is invalid.
//
// # Schema
//
//	domain: <string, required, unique across files>
//	descriptors:                       # optional list
//	  - key: <string, required>
//	    value: <string, optional ("" or null: absent); '*' matches any run of characters>
//	    rate_limit:                    # optional; or rate_limits, not both
//	      unit: second|minute|hour|day|week|month|year   # or window
//	      window: <Go duration: 500ms, 90s, 1h30m>       # or unit
//	      requests_per_unit: <integer; 0 or missing blocks, with a warning when missing>
//	      algorithm: sliding_window|fixed_window|token_bucket|sliding_log
//	      burst: <positive integer, token_bucket only; default requests_per_unit>
//	      failure_mode: fallback|allow|deny
//	      name: <string; default the rule ID>
//	      replaces: [{name: <a rate_limit name of this domain>}]
//	      unlimited: <bool; without unit/window (requests_per_unit ignored)>
//	    rate_limits: [<rate_limit>, ...]   # several limits, all must pass
//	    shadow_mode: <bool>
//	    quota_mode: <bool; as shadow_mode>
//	    share_threshold: <bool; a wildcard value's matches share a counter>
//	    detailed_metric: <bool; no effect>
//	    value_to_metric: <bool; no effect>
//	    descriptors: [...]              # nested descriptors
//
// Units are fixed lengths, as in envoyproxy/ratelimit: a month is 30 days
// and a year 365 days (windows are epoch-aligned, not calendar-aligned).
// Unit names are case-insensitive. Booleans also accept YAML 1.1's yes/no/
// on/off, and scalars of any type are read as strings for key, value, name
// and domain, as envoyproxy/ratelimit's YAML library does. Anchors, aliases
// and merge keys (<<) work. A key whose value is null is as if absent, and
// of a key given twice the last counts (with a warning), as envoyproxy/
// ratelimit's YAML library decodes. Unknown keys are errors, at every
// level; one of envoyproxy/ratelimit's keys out of place is ignored with a
// warning, as that service ignores it. Config.Warnings lists what loaded
// but has no effect.
//
// Limits: requests_per_unit and burst are at most MaxRequests (2^53−1);
// sliding_window and fixed_window allow at most 2^51−1 requests per window
// (limiter.MaxWindowRequests); sliding_log allows at most
// MaxSlidingLogRequests (10000) requests per window; a token bucket's burst
// (or requests_per_unit) and a sliding log's requests_per_unit, times the
// window in milliseconds, are at most MaxRequests (Countable); descriptors nest at most MaxDepth levels; one load holds at most
// MaxDescriptors descriptors. A window must be positive and a whole number of
// milliseconds.
//
// requests_per_unit: 0 blocks, as in envoyproxy/ratelimit's README: every
// request is over the limit and nothing is counted (Limit.Blocked).
//
// Differences from envoyproxy/ratelimit: `*` may appear anywhere in a value,
// not only at its end; a key containing '.' or '=' whose rule ID equals
// another rule's is refused (the ID names the counters).
//
// # Identity
//
// Every descriptor with a rate limit compiles to a Rule whose ID is the
// dotted path of its keys from the domain root, with "=value" for valued
// descriptors: "remote_address", "tenant.user", "path=/login*",
// "database=users.message_type=marketing". The ID names the rule's counters
// (Limit.ID, with "#<index>" from 0 when rate_limits lists several limits),
// so renaming a key or value starts new counters while editing numbers keeps
// them. Rule.Name is the configured name, else the ID.
//
// Names need not be unique within a domain (as in envoyproxy/ratelimit):
// replaces: [{name: n}] refers to every rate limit configured with the name
// n (an unnamed limit is never replaced); it is a warning when no rate limit
// of the domain is named n, and an error when n names the replacing rate
// limit itself.
//
// # Matching
//
// See Config.Match: envoyproxy/ratelimit's rules — exact key+value first,
// then wildcard values in file order, then the key-only descriptor; the
// request must end exactly at a descriptor that has a rate limit.
//
// # Reloading
//
// A Watcher polls the folder (default every 5s) and reloads when the names
// or bytes of its configuration files change; Reload forces a check (wire
// SIGHUP to it). An invalid configuration is reported and the last good
// one stays current. Writers should replace files atomically (write a
// hidden temporary file, then rename it), as Kubernetes does with its
// ..data symlink: a half-written file is rejected like any invalid one.
//
// # Errors
//
// Every problem of a load is reported together, as an ErrorList of
// "file:line:col: message" entries sorted by position.
package descriptors
