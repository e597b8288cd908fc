package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	// The typed_config types envoy.yaml uses: registering them lets protojson
	// resolve each google.protobuf.Any by its @type.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

// httpProtocolOptionsKey is the typed_extension_protocol_options key that
// selects the upstream HTTP protocol of a cluster.
const httpProtocolOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

// envoyConfig is a decoded and checked Envoy bootstrap with what the checks
// found inside it.
type envoyConfig struct {
	Bootstrap *bootstrapv3.Bootstrap
	// RateLimitFilters are the envoy.filters.http.ratelimit configurations.
	RateLimitFilters []*ratelimitv3.RateLimit
	// RateLimitPolicies are the route and virtual host rate_limits entries.
	RateLimitPolicies []*routev3.RateLimit
}

// Cluster returns the static cluster called name, or nil.
func (c *envoyConfig) Cluster(name string) *clusterv3.Cluster {
	for _, cl := range c.Bootstrap.GetStaticResources().GetClusters() {
		if cl.GetName() == name {
			return cl
		}
	}
	return nil
}

// RateLimitCluster returns the cluster name of the first rate-limit filter's
// gRPC service.
func (c *envoyConfig) RateLimitCluster() string {
	for _, f := range c.RateLimitFilters {
		if n := f.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(); n != "" {
			return n
		}
	}
	return ""
}

// clusterAddress returns the single socket address of cluster cl.
func clusterAddress(cl *clusterv3.Cluster) (host string, port uint32, err error) {
	var addrs []*corev3.SocketAddress
	for _, le := range cl.GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			if sa := lb.GetEndpoint().GetAddress().GetSocketAddress(); sa != nil {
				addrs = append(addrs, sa)
			}
		}
	}
	if len(addrs) != 1 {
		return "", 0, fmt.Errorf("cluster %q has %d socket addresses, want 1", cl.GetName(), len(addrs))
	}
	return addrs[0].GetAddress(), addrs[0].GetPortValue(), nil
}

// loadEnvoyConfig reads the Envoy bootstrap YAML at path strictly (unknown
// fields are errors), validates it and every typed_config inside it with the
// protoc-gen-validate rules, and checks that it is consistent: every cluster
// a route or a gRPC service names exists, every gRPC cluster speaks HTTP/2,
// and there is a rate-limit filter talking v3 to a cluster. It returns every
// problem found, each naming path.
func loadEnvoyConfig(path string) (*envoyConfig, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	js, err := yamlToJSON(src)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, bs); err != nil {
		return nil, fmt.Errorf("%s: %s", path, explainProtoJSONError(src, err))
	}
	cfg := &envoyConfig{Bootstrap: bs}
	var errs []error
	if err := bs.ValidateAll(); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", path, err))
	}
	// ValidateAll stops at google.protobuf.Any: unpack and validate each.
	var grpcClusters, routeClusters []string
	walkErrs := walkMessages(bs.ProtoReflect(), path+": bootstrap", func(at string, m proto.Message) error {
		switch m := m.(type) {
		case *ratelimitv3.RateLimit:
			cfg.RateLimitFilters = append(cfg.RateLimitFilters, m)
		case *routev3.RateLimit:
			cfg.RateLimitPolicies = append(cfg.RateLimitPolicies, m)
		case *corev3.GrpcService_EnvoyGrpc:
			grpcClusters = append(grpcClusters, m.GetClusterName())
		case *routev3.RouteAction:
			if c := m.GetCluster(); c != "" {
				routeClusters = append(routeClusters, c)
			}
			for _, wc := range m.GetWeightedClusters().GetClusters() {
				routeClusters = append(routeClusters, wc.GetName())
			}
		}
		return nil
	})
	errs = append(errs, walkErrs...)

	defined := map[string]bool{}
	for _, cl := range bs.GetStaticResources().GetClusters() {
		defined[cl.GetName()] = true
	}
	for _, name := range uniq(routeClusters) {
		if !defined[name] {
			errs = append(errs, fmt.Errorf("%s: a route forwards to cluster %q, which is not defined in static_resources.clusters", path, name))
		}
	}
	for _, name := range uniq(grpcClusters) {
		cl := cfg.Cluster(name)
		if cl == nil {
			errs = append(errs, fmt.Errorf("%s: a gRPC service (envoy_grpc) names cluster %q, which is not defined in static_resources.clusters", path, name))
			continue
		}
		if err := requireHTTP2(cl); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
		}
	}
	if len(cfg.RateLimitFilters) == 0 {
		errs = append(errs, fmt.Errorf("%s: no envoy.filters.http.ratelimit filter", path))
	}
	for _, f := range cfg.RateLimitFilters {
		if f.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName() == "" {
			errs = append(errs, fmt.Errorf("%s: the ratelimit filter's rate_limit_service has no envoy_grpc cluster", path))
		}
		if f.GetRateLimitService().GetTransportApiVersion() != corev3.ApiVersion_V3 {
			errs = append(errs, fmt.Errorf("%s: the ratelimit filter's rate_limit_service.transport_api_version must be V3", path))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// requireHTTP2 reports an error unless cluster cl is configured to speak
// HTTP/2 to its endpoints, as gRPC needs: explicit_http_config with
// http2_protocol_options in its HttpProtocolOptions.
func requireHTTP2(cl *clusterv3.Cluster) error {
	anyOpts, ok := cl.GetTypedExtensionProtocolOptions()[httpProtocolOptionsKey]
	if !ok {
		return fmt.Errorf("cluster %q carries gRPC but does not speak HTTP/2: add typed_extension_protocol_options[%s] with explicit_http_config.http2_protocol_options", cl.GetName(), httpProtocolOptionsKey)
	}
	opts := &upstreamhttpv3.HttpProtocolOptions{}
	if err := anyOpts.UnmarshalTo(opts); err != nil {
		return fmt.Errorf("cluster %q: typed_extension_protocol_options[%s]: %w", cl.GetName(), httpProtocolOptionsKey, err)
	}
	if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		return fmt.Errorf("cluster %q carries gRPC but does not speak HTTP/2: its HttpProtocolOptions need explicit_http_config.http2_protocol_options (auto_config falls back to HTTP/1.1 without TLS)", cl.GetName())
	}
	return nil
}

// walkMessages calls visit for m and every message below it, unpacking
// google.protobuf.Any values (an unknown @type is an error). at is a path
// like bootstrap.static_resources.listeners[0].filter_chains[0]...
func walkMessages(m protoreflect.Message, at string, visit func(at string, m proto.Message) error) []error {
	var errs []error
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return []error{fmt.Errorf("%s: %w", at, err)}
		}
		at += "<" + a.GetTypeUrl() + ">"
		// The Bootstrap's ValidateAll stops at Any: validate what it holds.
		if v, ok := inner.(interface{ ValidateAll() error }); ok {
			if err := v.ValidateAll(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", at, err))
			}
		}
		return append(errs, walkMessages(inner.ProtoReflect(), at, visit)...)
	}
	if err := visit(at, m.Interface()); err != nil {
		errs = append(errs, err)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := at + "." + string(fd.Name())
		switch {
		case fd.IsList() && fd.Kind() == protoreflect.MessageKind:
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				errs = append(errs, walkMessages(l.Get(i).Message(), fmt.Sprintf("%s[%d]", name, i), visit)...)
			}
		case fd.IsMap() && fd.MapValue().Kind() == protoreflect.MessageKind:
			var keys []string
			vals := map[string]protoreflect.Message{}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				keys = append(keys, k.String())
				vals[k.String()] = mv.Message()
				return true
			})
			sort.Strings(keys)
			for _, k := range keys {
				errs = append(errs, walkMessages(vals[k], fmt.Sprintf("%s[%s]", name, k), visit)...)
			}
		case !fd.IsList() && !fd.IsMap() && fd.Kind() == protoreflect.MessageKind:
			errs = append(errs, walkMessages(v.Message(), name, visit)...)
		}
		return true
	})
	return errs
}

// yamlToJSON converts YAML (anchors and aliases resolved) to JSON for
// protojson.
func yamlToJSON(src []byte) ([]byte, error) {
	var v any
	if err := yaml.Unmarshal(src, &v); err != nil {
		return nil, err
	}
	v, err := jsonCompatible(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func jsonCompatible(v any) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			c, err := jsonCompatible(e)
			if err != nil {
				return nil, err
			}
			v[k] = c
		}
		return v, nil
	case map[any]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("mapping key %v is not a string", k)
			}
			c, err := jsonCompatible(e)
			if err != nil {
				return nil, err
			}
			out[ks] = c
		}
		return out, nil
	case []any:
		for i, e := range v {
			c, err := jsonCompatible(e)
			if err != nil {
				return nil, err
			}
			v[i] = c
		}
		return v, nil
	default:
		return v, nil
	}
}

var unknownFieldRE = regexp.MustCompile(`unknown field "([^"]+)"`)

// explainProtoJSONError turns protojson's error (positions in the generated
// JSON) into one that names the YAML line of an unknown field.
func explainProtoJSONError(src []byte, err error) string {
	msg := err.Error()
	m := unknownFieldRE.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	var root yaml.Node
	if yaml.Unmarshal(src, &root) != nil {
		return msg
	}
	var lines []string
	var find func(n *yaml.Node)
	find = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == m[1] {
					lines = append(lines, fmt.Sprintf("%d:%d", n.Content[i].Line, n.Content[i].Column))
				}
			}
		}
		for _, c := range n.Content {
			find(c)
		}
	}
	find(&root)
	if len(lines) == 0 {
		return msg
	}
	return fmt.Sprintf("%s: unknown field %q (not in the Envoy API; misspelled?)", strings.Join(lines, ", "), m[1])
}

func uniq(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// descriptorEntry is one entry of a descriptor Envoy sends: Value is "" when
// it comes from the request (a header, the client address).
type descriptorEntry struct{ Key, Value string }

func (e descriptorEntry) String() string {
	if e.Value == "" {
		return e.Key + "=*"
	}
	return e.Key + "=" + e.Value
}

// envoyDescriptor returns the descriptor entries one rate_limits entry
// produces.
func envoyDescriptor(rl *routev3.RateLimit) ([]descriptorEntry, error) {
	var out []descriptorEntry
	for _, a := range rl.GetActions() {
		switch {
		case a.GetRemoteAddress() != nil:
			out = append(out, descriptorEntry{Key: "remote_address"})
		case a.GetRequestHeaders() != nil:
			out = append(out, descriptorEntry{Key: a.GetRequestHeaders().GetDescriptorKey()})
		case a.GetGenericKey() != nil:
			k := a.GetGenericKey().GetDescriptorKey()
			if k == "" {
				k = "generic_key"
			}
			out = append(out, descriptorEntry{Key: k, Value: a.GetGenericKey().GetDescriptorValue()})
		default:
			return nil, fmt.Errorf("rate limit action %v is not understood by this check", a)
		}
	}
	return out, nil
}

// descriptorRule is the part of a descriptor config rule the cross-check
// needs (the incumbent's vocabulary).
type descriptorRule struct {
	Key         string           `yaml:"key"`
	Value       string           `yaml:"value"`
	RateLimit   *yaml.Node       `yaml:"rate_limit"`
	RateLimits  []yaml.Node      `yaml:"rate_limits"`
	Descriptors []descriptorRule `yaml:"descriptors"`
}

type descriptorFile struct {
	Domain      string           `yaml:"domain"`
	Descriptors []descriptorRule `yaml:"descriptors"`
}

// crossCheckDescriptors reports every descriptor cfg's rate_limits produce
// that no limit of the descriptor file at path matches, every limit in that
// file that no descriptor reaches, and a domain mismatch.
func crossCheckDescriptors(cfg *envoyConfig, path string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var f descriptorFile
	dec := yaml.NewDecoder(bytes.NewReader(src))
	if err := dec.Decode(&f); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var errs []error
	for _, flt := range cfg.RateLimitFilters {
		if flt.GetDomain() != f.Domain {
			errs = append(errs, fmt.Errorf("the ratelimit filter uses domain %q but %s declares %q", flt.GetDomain(), path, f.Domain))
		}
	}
	reached := map[*descriptorRule]bool{}
	for _, rl := range cfg.RateLimitPolicies {
		d, err := envoyDescriptor(rl)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rule := matchRule(f.Descriptors, d)
		if rule == nil || (rule.RateLimit == nil && len(rule.RateLimits) == 0) {
			errs = append(errs, fmt.Errorf("envoy sends descriptor %v, which no limit in %s matches", d, path))
			continue
		}
		reached[rule] = true
	}
	var unreached func(rules []descriptorRule, at string)
	unreached = func(rules []descriptorRule, at string) {
		for i := range rules {
			r := &rules[i]
			name := at + (descriptorEntry{Key: r.Key, Value: r.Value}).String()
			if (r.RateLimit != nil || len(r.RateLimits) > 0) && !reached[r] {
				errs = append(errs, fmt.Errorf("%s: the limit on [%s] is never reached: envoy.yaml sends no such descriptor", path, name))
			}
			unreached(r.Descriptors, name+", ")
		}
	}
	unreached(f.Descriptors, "")
	return errors.Join(errs...)
}

// matchRule follows the incumbent's matching for a descriptor whose request
// values are unknown ("" in d): exact key+value for fixed values, else the
// key-only rule; it returns the rule at the descriptor's full depth, or nil.
func matchRule(rules []descriptorRule, d []descriptorEntry) *descriptorRule {
	if len(d) == 0 {
		return nil
	}
	var found *descriptorRule
	for i := range rules {
		r := &rules[i]
		if r.Key != d[0].Key {
			continue
		}
		if d[0].Value != "" && r.Value == d[0].Value {
			found = r
			break
		}
		if r.Value == "" && found == nil {
			found = r
		}
	}
	if found == nil || len(d) == 1 {
		return found
	}
	return matchRule(found.Descriptors, d[1:])
}
