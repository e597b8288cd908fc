package rls

import (
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// decodeCases are wire requests for the decoder tests, and whether
// decodeRequest decodes them (the others are left to proto.Unmarshal).
func decodeCases(t testing.TB) []struct {
	name string
	b    []byte
	fast bool
} {
	marshal := func(req *rlsv3.RateLimitRequest) []byte {
		b, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tag := func(b []byte, num protowire.Number, typ protowire.Type) []byte {
		return protowire.AppendTag(b, num, typ)
	}
	str := func(b []byte, num protowire.Number, s string) []byte {
		return protowire.AppendString(tag(b, num, protowire.BytesType), s)
	}
	msg := func(b []byte, num protowire.Number, m []byte) []byte {
		return protowire.AppendBytes(tag(b, num, protowire.BytesType), m)
	}
	entry := func(k, v string) []byte { return str(str(nil, fieldKey, k), fieldValue, v) }
	override := desc("user", "u")
	override.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MINUTE}
	perHits := desc("user", "u")
	perHits.HitsAddend = wrapperspb.UInt64(4)
	negative := desc("user", "u")
	negative.IsNegativeHits = true
	withUnknown := desc("user", "u")
	withUnknown.ProtoReflect().SetUnknown(str(nil, 99, "x"))

	return []struct {
		name string
		b    []byte
		fast bool
	}{
		{"empty", nil, true},
		{"usual", marshal(benchRequests(1)[0]), true},
		{"hits_addend", marshal(&rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 300, Descriptors: []*commonv3.RateLimitDescriptor{desc("a", "b")}}), true},
		{"many", marshal(request("d", desc("a", "1", "b", "2", "c", "3"), desc("x", ""), desc("", "y"), desc("k", "v", "k", "w"))), true},
		{"utf8", marshal(request("dömain", desc("ключ", "値"))), true},
		{"no_descriptors", marshal(&rlsv3.RateLimitRequest{Domain: "d"}), true},
		{"empty_descriptor", msg(str(nil, fieldDomain, "d"), fieldDescriptors, nil), true},
		{"empty_entry", msg(str(nil, fieldDomain, "d"), fieldDescriptors, msg(nil, fieldEntries, nil)), true},
		{"fields_out_of_order", str(msg(nil, fieldDescriptors, msg(nil, fieldEntries, str(str(nil, fieldValue, "v"), fieldKey, "k"))), fieldDomain, "d"), true},
		{"repeated_scalars_last_wins", protowire.AppendVarint(tag(
			msg(str(str(nil, fieldDomain, "first"), fieldDomain, "second"), fieldDescriptors,
				msg(nil, fieldEntries, str(str(entry("k1", "v1"), fieldKey, "k2"), fieldValue, "v2"))),
			fieldHitsAddend, protowire.VarintType), 1<<40+5), true},
		{"hits_addend_truncated_to_32_bits", protowire.AppendVarint(tag(nil, fieldHitsAddend, protowire.VarintType), 1<<32+9), true},
		{"override", marshal(request("d", override)), false},
		{"descriptor_hits_addend", marshal(request("d", perHits)), false},
		{"is_negative_hits", marshal(request("d", negative)), false},
		{"unknown_descriptor_field", marshal(request("d", withUnknown)), false},
		{"unknown_request_field", str(marshal(request("d", desc("a", "b"))), 9, "x"), false},
		{"unknown_entry_field", msg(nil, fieldDescriptors, msg(nil, fieldEntries, str(entry("k", "v"), 3, "x"))), false},
		{"domain_as_varint", protowire.AppendVarint(tag(nil, fieldDomain, protowire.VarintType), 1), false},
		{"hits_addend_as_bytes", str(nil, fieldHitsAddend, "x"), false},
		{"invalid_utf8_domain", str(nil, fieldDomain, "\xff"), false},
		{"invalid_utf8_key", msg(nil, fieldDescriptors, msg(nil, fieldEntries, entry("\xff", "v"))), false},
		{"invalid_utf8_value", msg(nil, fieldDescriptors, msg(nil, fieldEntries, entry("k", "v\xc3"))), true},
		{"truncated", marshal(benchRequests(1)[0])[:20], false},
		{"bad_tag", []byte{0}, false},
	}
}

// TestDecodeRequest checks decodeRequest against proto.Unmarshal: equal
// messages when it decodes, the request untouched when it does not.
func TestDecodeRequest(t *testing.T) {
	for _, c := range decodeCases(t) {
		t.Run(c.name, func(t *testing.T) {
			checkDecode(t, c.b, c.fast)
		})
	}
}

// checkDecode compares decodeRequest with proto.Unmarshal on b; fast
// (when not nil) is whether decodeRequest must decode b.
func checkDecode(t *testing.T, b []byte, fast any) {
	t.Helper()
	got := &rlsv3.RateLimitRequest{Domain: "sentinel", HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{desc("s", "s")}}
	before := proto.Clone(got)
	ok := decodeRequest(b, got)
	if fast != nil && ok != fast.(bool) {
		t.Fatalf("decodeRequest reported %v, want %v", ok, fast)
	}
	want := new(rlsv3.RateLimitRequest)
	err := proto.Unmarshal(b, want)
	if !ok {
		if !proto.Equal(got, before) {
			t.Fatalf("decodeRequest declined but changed the request to %v", got)
		}
		return
	}
	if err != nil {
		// A value need not be UTF-8 (see decodeRequest); nothing else
		// proto.Unmarshal refuses may pass.
		if path := findInvalidUTF8(b); !strings.HasSuffix(path, ".value") {
			t.Fatalf("decodeRequest decoded what proto.Unmarshal rejects (%v, at %q): %v", err, path, got)
		}
		return
	}
	if !proto.Equal(got, want) {
		t.Fatalf("decodeRequest\n%v\nproto.Unmarshal\n%v", got, want)
	}
	if len(got.Descriptors) == 0 && got.Descriptors != nil {
		t.Errorf("empty Descriptors not nil")
	}
	for i, d := range got.Descriptors {
		if len(d.Entries) == 0 && d.Entries != nil {
			t.Errorf("descriptor %d: empty Entries not nil", i)
		}
		if len(d.Entries) != cap(d.Entries) {
			t.Errorf("descriptor %d: Entries has spare capacity", i)
		}
	}
}

// FuzzDecodeRequest checks decodeRequest against proto.Unmarshal on
// arbitrary bytes.
//
//	go test -run '^$' -fuzz FuzzDecodeRequest ./pkg/rls
func FuzzDecodeRequest(f *testing.F) {
	for _, c := range decodeCases(f) {
		f.Add(c.b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecode(t, b, nil)
	})
}

// TestDecodeRequestAllocations: a request is six allocations whatever its
// number of descriptors and entries (its domain, one copy of its bytes,
// the descriptors, the entries and a slice of pointers to each).
func TestDecodeRequestAllocations(t *testing.T) {
	b, err := proto.Marshal(request("domain", desc("a", "1", "b", "2"), desc("c", "3"), desc("x", "y", "z", "w")))
	if err != nil {
		t.Fatal(err)
	}
	var req rlsv3.RateLimitRequest
	if n := testing.AllocsPerRun(100, func() {
		if !decodeRequest(b, &req) {
			t.Fatal("not decoded")
		}
	}); n != 6 {
		t.Errorf("%v allocations, want 6", n)
	}
}
