package rls

import (
	"bytes"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
	override := overrideOf(desc("user", "u"))
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
		{"too_many_descriptors", marshal(request("d", slices.Repeat([]*commonv3.RateLimitDescriptor{desc("k", "v")}, DefaultMaxDescriptors+1)...)), false},
		{"too_many_entries", marshal(request("d", desc("k", "v"), desc(slices.Repeat([]string{"k", "v"}, DefaultMaxEntries+1)...))), false},
		{"too_many_entries_and_descriptors", marshal(request("d", slices.Repeat([]*commonv3.RateLimitDescriptor{desc(slices.Repeat([]string{"k", ""}, DefaultMaxEntries+1)...)}, DefaultMaxDescriptors+1)...)), false},
		{"too_many_entries_override", marshal(request("d", overrideOf(desc(slices.Repeat([]string{"k", "v"}, DefaultMaxEntries+1)...)))), false},
		{"too_many_entries_then_malformed", append(msg(nil, fieldDescriptors, bytes.Repeat(msg(nil, fieldEntries, nil), DefaultMaxEntries+1)), 0), false},
		{"entries_as_varint_not_counted", protowire.AppendVarint(tag(msg(nil, fieldDescriptors, bytes.Repeat(protowire.AppendVarint(tag(nil, fieldEntries, protowire.VarintType), 1), DefaultMaxEntries+1)), fieldHitsAddend, protowire.VarintType), 1), false},
		{"bad_tag", []byte{0}, false},
	}
}

// overrideOf is d with a limit override.
func overrideOf(d *commonv3.RateLimitDescriptor) *commonv3.RateLimitDescriptor {
	d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MINUTE}
	return d
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
// (when not nil) is whether decodeRequest must decode b. It refuses
// exactly what checkCounts refuses of what proto.Unmarshal decodes.
func checkDecode(t *testing.T, b []byte, fast any) {
	t.Helper()
	got := &rlsv3.RateLimitRequest{Domain: "sentinel", HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{desc("s", "s")}}
	before := proto.Clone(got)
	lim := RequestLimits{}.withDefaults()
	ok, derr := decodeRequest(b, &lim, got)
	if fast != nil && ok != fast.(bool) {
		t.Fatalf("decodeRequest reported %v (error %v), want %v", ok, derr, fast)
	}
	want := new(rlsv3.RateLimitRequest)
	err := proto.Unmarshal(b, want)
	switch {
	case err == nil:
		if cerr := checkCounts(want, &lim); fmt.Sprint(derr) != fmt.Sprint(cerr) {
			t.Fatalf("decodeRequest's error %v, checkCounts' of what proto.Unmarshal decodes %v", derr, cerr)
		}
	case derr != nil && status.Code(derr) != codes.InvalidArgument:
		t.Fatalf("decodeRequest's error %v is not InvalidArgument", derr)
	}
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
	lim := RequestLimits{}.withDefaults()
	if n := testing.AllocsPerRun(100, func() {
		if ok, err := decodeRequest(b, &lim, &req); !ok || err != nil {
			t.Fatal("not decoded")
		}
	}); n != 6 {
		t.Errorf("%v allocations, want 6", n)
	}
}

// TestDecodeRefusesOverLimitsBeforeAllocating decodes requests of 200,000
// empty entries or empty descriptors (2 bytes each on the wire), of the
// usual shape (decodeRequest's) or with a limit override or an unknown
// field (proto.Unmarshal's): each is refused with the limit's error having
// allocated less than its own size. Both decoders allocate about 80 bytes
// for each such entry or descriptor when they decode it first, so a 4 MiB
// request cost well over 100 MiB.
func TestDecodeRefusesOverLimitsBeforeAllocating(t *testing.T) {
	const n = 200_000
	tag := func(b []byte, num protowire.Number) []byte { return protowire.AppendTag(b, num, protowire.BytesType) }
	str := func(b []byte, num protowire.Number, s string) []byte { return protowire.AppendString(tag(b, num), s) }
	override, err := proto.Marshal(overrideOf(desc()))
	if err != nil {
		t.Fatal(err)
	}
	empty := func(num protowire.Number) []byte { return bytes.Repeat(protowire.AppendBytes(tag(nil, num), nil), n) }
	entries := empty(fieldEntries)
	descriptors := empty(fieldDescriptors)
	withEntries := func(d []byte) []byte {
		return protowire.AppendBytes(tag(str(nil, fieldDomain, "d"), fieldDescriptors), d)
	}
	tooManyEntries := "descriptors[0].entries: 200000 entries exceed the maximum of 16"
	tooManyDescriptors := "descriptors: 200000 descriptors exceed the maximum of 64"
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"entries", withEntries(entries), tooManyEntries},
		{"entries_override", withEntries(append(entries, override...)), tooManyEntries},
		{"entries_unknown_field", str(withEntries(entries), 9, "x"), tooManyEntries},
		{"descriptors", append(str(nil, fieldDomain, "d"), descriptors...), tooManyDescriptors},
		{"descriptors_unknown_field", append(str(nil, 9, "x"), descriptors...), tooManyDescriptors},
	} {
		t.Run(c.name, func(t *testing.T) {
			lim := RequestLimits{}.withDefaults()
			in := lenientRequest{limits: &lim}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			before := ms.TotalAlloc
			err := in.Unmarshal(c.b)
			runtime.ReadMemStats(&ms)
			alloc := ms.TotalAlloc - before
			if err != nil {
				t.Fatal(err)
			}
			if status.Code(in.err) != codes.InvalidArgument || errMessage(in.err) != c.want {
				t.Errorf("error %v, want InvalidArgument %q", in.err, c.want)
			}
			t.Logf("%d bytes allocated for a request of %d", alloc, len(c.b))
			if alloc > uint64(len(c.b)) {
				t.Errorf("%d bytes allocated for a request of %d bytes, want at most as many", alloc, len(c.b))
			}
		})
	}
}
