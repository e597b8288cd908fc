package rls

import (
	"bytes"
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// structMetadata is the dynamic metadata as respond built it before it was
// encoded by hand: a structpb.Struct with the eight fields that metadata
// documents. It is the reference the encoded bytes are compared with.
func structMetadata(domain string, sc *scratch, k int) *structpb.Struct {
	q, r, m := &sc.reqs[k], &sc.res[k], &sc.meta[k]
	ruleID := ""
	if m.rule != nil {
		ruleID = m.rule.ID
	}
	str := structpb.NewStringValue
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		"domain":     str(domain),
		"rule":       str(m.ruleName),
		"rule_id":    str(ruleID),
		"limit":      str(m.name),
		"decision":   str(outcomeOf(q, r).String()),
		"source":     str(r.Source.String()),
		"descriptor": structpb.NewNumberValue(float64(m.desc)),
		"remaining":  structpb.NewNumberValue(float64(r.Remaining)),
	}}
}

// metaLimit is one limit's result in a metaCase.
type metaLimit struct {
	rule      *descriptors.Rule // nil: an override without a rule
	name      string
	shadow    bool
	allowed   bool
	remaining uint64
	retry     time.Duration
	source    limiter.Source
}

// metaCase is a response to build from hand-made limiter results: one
// descriptor per limit, top the index of the most restrictive one.
type metaCase struct {
	name   string
	domain string
	mode   HeaderMode
	limits []metaLimit
	top    int
}

// scratch returns the request and the scratch that respond would see after
// plan and Check for c.
func (c *metaCase) scratch() (*rlsv3.RateLimitRequest, *scratch) {
	req := &rlsv3.RateLimitRequest{Domain: c.domain}
	sc := new(scratch)
	for i, l := range c.limits {
		req.Descriptors = append(req.Descriptors, desc("k", "v"))
		ruleName := overrideName
		if l.rule != nil {
			ruleName = l.rule.Name
		}
		sc.descs = append(sc.descs, descState{kind: kindRule, rule: l.rule, first: i, n: 1})
		sc.reqs = append(sc.reqs, limiter.Request{
			Key: "key", Limit: limiter.Limit{Requests: 10, Window: time.Minute}, Hits: 1, Shadow: l.shadow,
		})
		sc.res = append(sc.res, limiter.Result{
			Allowed: l.allowed, Remaining: l.remaining, ResetAfter: 30 * time.Second,
			RetryAfter: l.retry, Source: l.source,
		})
		sc.meta = append(sc.meta, reqMeta{
			desc: i, rule: l.rule, ruleName: ruleName, name: l.name,
			unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, mult: 1,
		})
	}
	return req, sc
}

func metaCases() []metaCase {
	rule := &descriptors.Rule{ID: "user", Name: "per_user"}
	noID := &descriptors.Rule{Name: "unnamed"}
	long := &descriptors.Rule{ID: strings.Repeat("i", 200), Name: strings.Repeat("ü", 150)}
	return []metaCase{
		{name: "ok", domain: "edge", mode: HeadersIETF, limits: []metaLimit{
			{rule: rule, name: "per_user", allowed: true, remaining: 4},
		}},
		{name: "ok_remaining_0", domain: "edge", mode: HeadersNone, limits: []metaLimit{
			{rule: rule, name: "per_user", allowed: true, remaining: 0},
		}},
		{name: "over_limit_fallback", domain: "edge", mode: HeadersIETF, limits: []metaLimit{
			{rule: rule, name: "per_user", remaining: 0, retry: 1500 * time.Millisecond, source: limiter.SourceFallback},
		}},
		{name: "shadow_over_limit_fail_allow", domain: "edge", mode: HeadersDraft03, limits: []metaLimit{
			{rule: rule, name: "per_user", shadow: true, retry: time.Second, source: limiter.SourceFailAllow},
		}},
		{name: "draft03_over_limit", domain: "edge", mode: HeadersDraft03, limits: []metaLimit{
			{rule: rule, name: "per_user", retry: 2 * time.Second},
			{rule: noID, name: "other", allowed: true, remaining: 3},
		}},
		{name: "override_fail_deny", domain: "edge", mode: HeadersIETF, limits: []metaLimit{
			{name: overrideName, retry: time.Minute, source: limiter.SourceFailDeny},
		}},
		{name: "rule_without_id_empty_limit_name", domain: "edge", mode: HeadersNone, limits: []metaLimit{
			{rule: noID, allowed: true, remaining: 7},
		}},
		{name: "unknown_source", domain: "edge", mode: HeadersNone, limits: []metaLimit{
			{rule: rule, name: "per_user", allowed: true, remaining: 1, source: limiter.Source(9)},
		}},
		{name: "remaining_large", domain: "edge", mode: HeadersIETF, limits: []metaLimit{
			{rule: rule, name: "per_user", allowed: true, remaining: 1<<53 + 1},
			{rule: rule, name: "per_user", allowed: true, remaining: math.MaxUint64},
		}},
		{name: "second_descriptor_decides", domain: "edge", mode: HeadersIETF, top: 1, limits: []metaLimit{
			{rule: rule, name: "per_user", allowed: true, remaining: 100},
			{rule: noID, name: "tight", allowed: true, remaining: 2},
		}},
		{name: "several_descriptors", domain: "edge", mode: HeadersDraft03, top: 2, limits: []metaLimit{
			{rule: rule, name: "a", allowed: true, remaining: 1},
			{rule: noID, name: "b", shadow: true, retry: time.Hour},
			{rule: rule, name: "c", retry: time.Second, source: limiter.SourceFallback},
			{rule: noID, name: "d", allowed: true, remaining: 0},
		}},
		{name: "three_descriptors_ok", domain: "edge", mode: HeadersIETF, top: 2, limits: []metaLimit{
			{rule: rule, name: "per_ip", allowed: true, remaining: 90},
			{rule: noID, name: "per_user", allowed: true, remaining: 9},
			{rule: rule, name: "per_route", allowed: true, remaining: 5},
		}},
		{name: "three_descriptors_over_limit", domain: "edge", mode: HeadersDraft03, top: 1, limits: []metaLimit{
			{rule: rule, name: "per_ip", allowed: true, remaining: 90},
			{rule: noID, name: "per_user", retry: 3 * time.Second},
			{rule: rule, name: "per_route", allowed: true, remaining: 5},
		}},
		{name: "three_descriptors_over_limit_no_headers", domain: "edge", mode: HeadersNone, top: 2, limits: []metaLimit{
			{rule: rule, name: "per_ip", allowed: true, remaining: 90},
			{rule: noID, name: "per_user", allowed: true, remaining: 9},
			{rule: rule, name: "per_route", retry: 2 * time.Second},
		}},
		{name: "long_utf8_names", domain: strings.Repeat("d", 130), mode: HeadersIETF, limits: []metaLimit{
			{rule: long, name: "límite " + strings.Repeat("x", 120), allowed: true, remaining: 12345},
		}},
		{name: "long_names_many_descriptors", domain: strings.Repeat("d", 300), mode: HeadersNone, top: 2, limits: []metaLimit{
			{rule: rule, name: "a", allowed: true, remaining: 3},
			{rule: rule, name: "b", allowed: true, remaining: 2},
			{rule: long, name: strings.Repeat("n", 500), allowed: true, remaining: 1},
		}},
	}
}

// TestMetadataWireEquivalence builds responses with respond and the same
// responses with the metadata as a structpb.Struct (as respond did before
// it encoded the metadata by hand), marshals both, and checks that they
// decode to equal messages; the encoded Struct is byte for byte what a
// deterministic proto.Marshal writes.
func TestMetadataWireEquivalence(t *testing.T) {
	codec := encoding.GetCodecV2(grpcproto.Name)
	for _, c := range metaCases() {
		t.Run(c.name, func(t *testing.T) {
			svc := &Service{headers: c.mode}
			req, sc := c.scratch()
			got := svc.respond(req, sc)
			if got.DynamicMetadata != nil {
				t.Fatal("respond set DynamicMetadata; want the metadata encoded in the unknown fields")
			}
			ref := structMetadata(req.Domain, sc, c.top)
			want := proto.Clone(got).(*rlsv3.RateLimitResponse)
			want.ProtoReflect().SetUnknown(nil)
			want.DynamicMetadata = ref

			// The unknown fields are exactly one dynamic_metadata field
			// holding the deterministic encoding of the Struct.
			refBytes, err := proto.MarshalOptions{Deterministic: true}.Marshal(ref)
			if err != nil {
				t.Fatal(err)
			}
			wantRaw := protowire.AppendTag(nil, metadataField, protowire.BytesType)
			wantRaw = protowire.AppendBytes(wantRaw, refBytes)
			if raw := got.ProtoReflect().GetUnknown(); !bytes.Equal(raw, wantRaw) {
				t.Errorf("unknown fields\n%x\nwant\n%x", raw, wantRaw)
			}
			if proto.Size(got) != proto.Size(want) {
				t.Errorf("proto.Size %d, want %d", proto.Size(got), proto.Size(want))
			}

			gotWire, err := proto.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			wantWire, err := proto.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			codecWire, err := codec.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			defer codecWire.Free()
			var gotDec, wantDec, codecDec rlsv3.RateLimitResponse
			for _, u := range []struct {
				b []byte
				m *rlsv3.RateLimitResponse
			}{{gotWire, &gotDec}, {wantWire, &wantDec}, {codecWire.Materialize(), &codecDec}} {
				if err := proto.Unmarshal(u.b, u.m); err != nil {
					t.Fatal(err)
				}
			}
			if !proto.Equal(&gotDec, &wantDec) {
				t.Errorf("decoded response\n%v\nwant\n%v", &gotDec, &wantDec)
			}
			if !proto.Equal(&codecDec, &wantDec) {
				t.Errorf("decoded gRPC codec output\n%v\nwant\n%v", &codecDec, &wantDec)
			}
			if len(gotDec.ProtoReflect().GetUnknown()) != 0 || gotDec.DynamicMetadata == nil {
				t.Errorf("decoded response has unknown fields or no metadata: %v", &gotDec)
			}

			md, err := Metadata(got)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(md, ref) {
				t.Errorf("Metadata %v, want %v", md, ref)
			}
			if md, err := Metadata(&gotDec); err != nil || md != gotDec.DynamicMetadata {
				t.Errorf("Metadata of a decoded response: %v, %v; want its DynamicMetadata", md, err)
			}
		})
	}
}

// TestResponseBytesOwnership checks that the body and the metadata of a
// response are its own: two responses never share bytes, and appending to
// the body does not touch the metadata.
func TestResponseBytesOwnership(t *testing.T) {
	for _, c := range metaCases() {
		svc := &Service{headers: c.mode}
		req1, sc1 := c.scratch()
		req2, sc2 := c.scratch()
		r1, r2 := svc.respond(req1, sc1), svc.respond(req2, sc2)
		for _, p := range []struct {
			what string
			a, b []byte
		}{
			{"metadata", r1.ProtoReflect().GetUnknown(), r2.ProtoReflect().GetUnknown()},
			{"body", r1.RawBody, r2.RawBody},
		} {
			if !bytes.Equal(p.a, p.b) {
				t.Errorf("%s: the same results give different %s", c.name, p.what)
			}
			if len(p.a) > 0 && &p.a[0] == &p.b[0] {
				t.Errorf("%s: two responses share their %s", c.name, p.what)
			}
		}
		md := bytes.Clone(r1.ProtoReflect().GetUnknown())
		// One byte past the body: only the body's capacity cap keeps it
		// from landing on the metadata stored after it in the same block.
		_ = append(r1.RawBody, 'x')
		if !bytes.Equal(r1.ProtoReflect().GetUnknown(), md) {
			t.Errorf("%s: appending to the body changed the metadata", c.name)
		}
	}
}

// TestBlockSizes checks that the response blocks fill the size classes
// their comments name, no more.
func TestBlockSizes(t *testing.T) {
	if n := unsafe.Sizeof(okBlock{}); n > 1280 || n <= 1152 {
		t.Errorf("okBlock is %d bytes, want (1152, 1280]", n)
	}
	if n := unsafe.Sizeof(fullBlock{}); n > 1536 || n <= 1408 {
		t.Errorf("fullBlock is %d bytes, want (1408, 1536]", n)
	}
	if n := unsafe.Sizeof(okBlock4{}); n > 1536 || n <= 1408 {
		t.Errorf("okBlock4 is %d bytes, want (1408, 1536]", n)
	}
	if n := unsafe.Sizeof(fullBlock4{}); n > 2048 || n <= 1792 {
		t.Errorf("fullBlock4 is %d bytes, want (1792, 2048]", n)
	}
}

// TestRespondAllocations checks that a response of up to four descriptors
// with short names is two allocations, OK or OVER_LIMIT: its block (with
// its headers, body and metadata) and the string of its header values.
func TestRespondAllocations(t *testing.T) {
	for _, c := range metaCases() {
		if len(c.limits) > mediumResponse || len(c.domain) > 10 || c.name == "unknown_source" {
			continue // more descriptors, long names, or a Source that fmt names
		}
		t.Run(c.name, func(t *testing.T) {
			svc := &Service{headers: c.mode}
			req, sc := c.scratch()
			// headerCount sizes the block before addHeaders runs: the two
			// must agree.
			r := svc.respond(req, sc)
			n, body := svc.headerCount(sc)
			if got := len(r.ResponseHeadersToAdd); n != got {
				t.Fatalf("headerCount = %d, but the response has %d headers", n, got)
			}
			if body != (r.RawBody != nil) {
				t.Fatalf("headerCount's body = %v, but the response's body is %q", body, r.RawBody)
			}
			want := 2.0
			if n == 0 {
				want = 1
			}
			got := testing.AllocsPerRun(100, func() {
				sc.hdr, sc.hdrNames, sc.hdrEnds = sc.hdr[:0], sc.hdrNames[:0], sc.hdrEnds[:0]
				svc.respond(req, sc)
			})
			if got != want {
				t.Errorf("%v allocations, want %v", got, want)
			}
		})
	}
}

func TestMetadataAccessor(t *testing.T) {
	if md, err := Metadata(nil); md != nil || err != nil {
		t.Errorf("Metadata(nil) = %v, %v", md, err)
	}
	if md, err := Metadata(&rlsv3.RateLimitResponse{}); md != nil || err != nil {
		t.Errorf("Metadata of an empty response = %v, %v", md, err)
	}
	set := &rlsv3.RateLimitResponse{DynamicMetadata: &structpb.Struct{}}
	if md, err := Metadata(set); md != set.DynamicMetadata || err != nil {
		t.Errorf("Metadata returned %v, %v; want the DynamicMetadata field", md, err)
	}
	bad := &rlsv3.RateLimitResponse{}
	raw := protowire.AppendTag(nil, metadataField, protowire.BytesType)
	raw = protowire.AppendBytes(raw, []byte{0x0a, 0x05}) // an entry longer than the Struct
	bad.ProtoReflect().SetUnknown(raw)
	if md, err := Metadata(bad); err == nil {
		t.Errorf("Metadata of malformed bytes = %v, want an error", md)
	}
}

// FuzzMetadata compares the hand-encoded metadata with the deterministic
// marshaling of the equivalent Struct for arbitrary names and numbers.
//
//	go test -run '^$' -fuzz FuzzMetadata ./pkg/rls
func FuzzMetadata(f *testing.F) {
	f.Add("edge", "per_user", "user", "per_user", 0, uint64(0), true, false, uint8(0))
	f.Add("", "", "", "", 1, uint64(math.MaxUint64), false, true, uint8(3))
	f.Add(strings.Repeat("ß", 200), "r", "", "ünï", 7, uint64(1)<<60, false, false, uint8(1))
	f.Fuzz(func(t *testing.T, domain, ruleName, ruleID, name string, d int, remaining uint64, allowed, shadow bool, source uint8) {
		for _, s := range []string{domain, ruleName, ruleID, name} {
			if !utf8.ValidString(s) {
				return // proto3 strings; the service never has others
			}
		}
		c := metaCase{domain: domain, limits: []metaLimit{{
			rule: &descriptors.Rule{ID: ruleID, Name: ruleName}, name: name, shadow: shadow,
			allowed: allowed, remaining: remaining, source: limiter.Source(source),
		}}}
		req, sc := c.scratch()
		sc.meta[0].desc = d
		ref, err := proto.MarshalOptions{Deterministic: true}.Marshal(structMetadata(req.Domain, sc, 0))
		if err != nil {
			t.Fatal(err)
		}
		want := protowire.AppendTag(nil, metadataField, protowire.BytesType)
		want = protowire.AppendBytes(want, ref)
		if got := metadata(nil, req.Domain, sc, 0); !bytes.Equal(got, want) {
			t.Errorf("metadata\n%x\nwant\n%x", got, want)
		}
	})
}

// TestMetadataGRPCRoundTrip compares the response ShouldRateLimit returns
// in the server with the one the gRPC client decodes: equal, the client's
// metadata in DynamicMetadata, and FormatResponse renders both alike.
func TestMetadataGRPCRoundTrip(t *testing.T) {
	var (
		mu     sync.Mutex
		served []*rlsv3.RateLimitResponse
	)
	keep := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if r, ok := resp.(*rlsv3.RateLimitResponse); ok {
			mu.Lock()
			served = append(served, r)
			mu.Unlock()
		}
		return resp, err
	}
	e := newEnv(t, testFiles, Options{}, grpc.UnaryInterceptor(keep))
	for i, ds := range [][]*commonv3.RateLimitDescriptor{
		{desc("user", "u")},
		{desc("slow", "s"), desc("user", "u")},
		{desc("slow", "s"), desc("user", "u")},                            // slow denies
		{desc("shadowed", "s"), desc("shadowed", "s"), desc("free", "f")}, // three descriptors, shadow denial
		{desc("multi", "m"), desc("ninety", "n"), desc("bucket", "b")},
	} {
		got := e.must(request("test", ds...))
		mu.Lock()
		if len(served) != 1 {
			mu.Unlock()
			t.Fatalf("request %d: %d responses served", i, len(served))
		}
		in := served[0]
		served = served[:0]
		mu.Unlock()
		md, err := Metadata(in)
		if err != nil {
			t.Fatal(err)
		}
		if in.DynamicMetadata != nil || md == nil {
			t.Fatalf("request %d: served DynamicMetadata %v, Metadata %v", i, in.DynamicMetadata, md)
		}
		want := proto.Clone(in).(*rlsv3.RateLimitResponse)
		want.ProtoReflect().SetUnknown(nil)
		want.DynamicMetadata = md
		if !proto.Equal(got, want) {
			t.Errorf("request %d: client decoded\n%v\nwant\n%v", i, got, want)
		}
		if len(got.ProtoReflect().GetUnknown()) != 0 {
			t.Errorf("request %d: client sees unknown fields %x", i, got.ProtoReflect().GetUnknown())
		}
		var inText, gotText bytes.Buffer
		if err := FormatResponse(&inText, in); err != nil {
			t.Fatal(err)
		}
		if err := FormatResponse(&gotText, got); err != nil {
			t.Fatal(err)
		}
		if inText.String() != gotText.String() || !strings.Contains(inText.String(), "\nmetadata:\n") {
			t.Errorf("request %d: FormatResponse in the server\n%s\nand in the client\n%s", i, &inText, &gotText)
		}
	}
}
