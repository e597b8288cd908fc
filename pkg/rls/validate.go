package rls

import (
	"errors"
	"fmt"
	"math"
	"time"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// invalid returns the InvalidArgument error for a bad field.
func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// validate checks everything about req that does not need the configuration.
// It runs before anything is matched or counted, so a bad request consumes
// nothing. The error is an InvalidArgument status naming the field. Too many
// descriptors, or entries in a descriptor, is reported first, as
// scanRequest reports it for a request on the wire before decoding it.
func (s *Service) validate(req *rlsv3.RateLimitRequest) error {
	lim := &s.limits
	if req == nil {
		return invalid("request: must not be null")
	}
	if err := checkCounts(req, lim); err != nil {
		return err
	}
	if err := checkString("domain", req.Domain, lim.MaxDomainBytes); err != nil {
		return err
	}
	if len(req.Descriptors) == 0 {
		return invalid("descriptors: must not be empty")
	}
	for i, d := range req.Descriptors {
		if d == nil {
			return invalid("descriptors[%d]: must not be null", i)
		}
		if len(d.Entries) == 0 {
			return invalid("descriptors[%d].entries: must not be empty", i)
		}
		for j, e := range d.Entries {
			if e == nil {
				return invalid("descriptors[%d].entries[%d]: must not be null", i, j)
			}
			if err := checkEntry(i, j, e.Key, lim); err != nil {
				return err
			}
		}
		if d.Limit != nil {
			if err := checkOverride(i, d.Limit); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkCounts refuses a request of more descriptors than lim.MaxDescriptors
// (tooManyDescriptors), else one with a descriptor of more entries than
// lim.MaxEntries (tooManyEntries, the first such descriptor).
func checkCounts(req *rlsv3.RateLimitRequest, lim *RequestLimits) error {
	if n := len(req.Descriptors); n > lim.MaxDescriptors {
		return tooManyDescriptors(n, lim)
	}
	for i, d := range req.Descriptors {
		if m := len(d.GetEntries()); m > lim.MaxEntries {
			return tooManyEntries(i, m, lim)
		}
	}
	return nil
}

// tooManyDescriptors is the error for a request of n descriptors, more than
// lim.MaxDescriptors, and tooManyEntries for its descriptor i of m entries,
// more than lim.MaxEntries. checkCounts gives them for a decoded request,
// scanRequest for one on the wire, before anything is allocated for its
// descriptors.
func tooManyDescriptors(n int, lim *RequestLimits) error {
	return invalid("descriptors: %d descriptors exceed the maximum of %d", n, lim.MaxDescriptors)
}

func tooManyEntries(i, m int, lim *RequestLimits) error {
	return invalid("descriptors[%d].entries: %d entries exceed the maximum of %d", i, m, lim.MaxEntries)
}

func checkString(field, v string, max int) error {
	switch {
	case v == "":
		return invalid("%s: must not be empty", field)
	case len(v) > max:
		return invalid("%s: %d bytes exceed the maximum of %d", field, len(v), max)
	case !utf8.ValidString(v):
		return invalid("%s: invalid UTF-8", field)
	}
	return nil
}

// checkEntry checks a descriptor entry's key, which Envoy's configuration
// names: not empty, at most MaxKeyBytes, UTF-8. Its value is not checked: it
// is often a client's (a header Envoy copies as it came: empty, long, or not
// UTF-8), and refusing the request for it would let the request through
// uncounted on every descriptor, since Envoy admits a request whose check
// failed unless failure_mode_deny is set. An empty value matches a key-only
// rule or a "*" pattern, as in envoyproxy/ratelimit; a value longer than
// MaxValueBytes is counted under its digest (appendValue).
func checkEntry(i, j int, key string, lim *RequestLimits) error {
	if key != "" && len(key) <= lim.MaxKeyBytes && utf8.ValidString(key) {
		return nil
	}
	return checkString(fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), key, lim.MaxKeyBytes)
}

func checkOverride(i int, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) error {
	if overrideUnitSeconds(o.Unit) == 0 {
		return invalid("descriptors[%d].limit.unit: %v is not a known unit", i, o.Unit)
	}
	if o.UnitMultiplier != nil && o.UnitMultiplier.Value == 0 {
		return invalid("descriptors[%d].limit.unit_multiplier: must be positive", i)
	}
	// A window a time.Duration holds. Whether its algorithm counts it is
	// known once the descriptor is matched (plan, with descriptors.Countable).
	if _, ok := overrideWindow(o); !ok {
		return invalid("descriptors[%d].limit: a window of %d × %v is longer than %v", i, overrideMultiplier(o), o.Unit, time.Duration(math.MaxInt64).Truncate(time.Hour))
	}
	return nil
}

// overrideMultiplier is the override's unit_multiplier, 1 when absent.
func overrideMultiplier(o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) uint32 {
	if o.UnitMultiplier == nil {
		return 1
	}
	return o.UnitMultiplier.Value
}

// overrideWindow is the override's window, unit × unit_multiplier, and
// whether a Duration holds it (unit seconds × multiplier is below 2^25 ×
// 2^32: the product does not overflow).
func overrideWindow(o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) (time.Duration, bool) {
	secs := uint64(overrideUnitSeconds(o.Unit)) * uint64(overrideMultiplier(o))
	if secs > uint64(math.MaxInt64/int64(time.Second)) {
		return 0, false
	}
	return time.Duration(secs) * time.Second, true
}

// overrideUnitSeconds is the length of a RateLimitUnit in seconds, as the
// incumbent counts them (a month is 30 days, a year 365 days); 0 for UNKNOWN
// and values outside the enum.
func overrideUnitSeconds(u typev3.RateLimitUnit) int64 {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return 1
	case typev3.RateLimitUnit_MINUTE:
		return 60
	case typev3.RateLimitUnit_HOUR:
		return 3600
	case typev3.RateLimitUnit_DAY:
		return 86400
	case typev3.RateLimitUnit_MONTH:
		return 30 * 86400
	case typev3.RateLimitUnit_YEAR:
		return 365 * 86400
	}
	return 0
}

// lenientRequest is what the registered gRPC handler decodes into. Standard
// proto decoding rejects a proto3 string that is not valid UTF-8, and gRPC
// turns any decoding failure into codes.Internal before a handler runs; Envoy
// can send such bytes (a header value is not necessarily UTF-8), and it
// should learn that its request was bad, and which field. lenientRequest is
// a legacy-style message with its own Unmarshal method (the protobuf runtime
// calls it instead of reflecting), which decodes the real request and keeps a
// decoding error as an InvalidArgument status naming the field.
type lenientRequest struct {
	req rlsv3.RateLimitRequest
	err error
	// limits bounds the descriptors and entries decoded (see
	// decodeRequest); nil stands for the defaults. Reset keeps it.
	limits *RequestLimits
}

// Reset, String and ProtoMessage make lenientRequest a (legacy) proto
// message for the gRPC codec.
func (r *lenientRequest) Reset()         { r.req.Reset(); r.err = nil }
func (r *lenientRequest) String() string { return r.req.String() }
func (*lenientRequest) ProtoMessage()    {}

// Unmarshal decodes b; it never fails, see lenientRequest. A request over
// r.limits' counts of descriptors or entries is refused before it is
// decoded; a request of the usual shape is decoded by decodeRequest, any
// other by proto.Unmarshal.
func (r *lenientRequest) Unmarshal(b []byte) error {
	lim := r.limits
	if lim == nil {
		def := RequestLimits{}.withDefaults()
		lim = &def
	}
	fast, err := decodeRequest(b, lim, &r.req)
	switch {
	case err != nil:
		r.err = err
	case !fast:
		if err := proto.Unmarshal(b, &r.req); err != nil {
			r.err = decodeError(b, err)
		}
	}
	return nil
}

// decodeError finds the field whose bytes made proto.Unmarshal fail with err:
// the first string that is not UTF-8, with its path. Otherwise the request is
// malformed protobuf.
func decodeError(b []byte, err error) error {
	if path := findInvalidUTF8(b); path != "" {
		return invalid("%s: invalid UTF-8", path)
	}
	return invalid("request: malformed protobuf: %v", err)
}

// Field numbers of RateLimitRequest and its nested messages.
const (
	fieldDomain          = 1 // RateLimitRequest.domain
	fieldDescriptors     = 2 // RateLimitRequest.descriptors
	fieldHitsAddend      = 3 // RateLimitRequest.hits_addend, a uint32
	fieldEntries         = 1 // RateLimitDescriptor.entries
	fieldLimit           = 2 // RateLimitDescriptor.limit, a RateLimitOverride
	fieldDescHitsAddend  = 3 // RateLimitDescriptor.hits_addend, a UInt64Value
	fieldIsNegativeHits  = 4 // RateLimitDescriptor.is_negative_hits
	fieldKey             = 1 // Entry.key
	fieldValue           = 2 // Entry.value
	fieldRequestsPerUnit = 1 // RateLimitOverride.requests_per_unit, a uint32
	fieldUnit            = 2 // RateLimitOverride.unit, a RateLimitUnit
	fieldUnitMultiplier  = 3 // RateLimitOverride.unit_multiplier, a UInt32Value
	fieldWrapperValue    = 1 // UInt32Value.value, UInt64Value.value
)

// maxRequestBytes is the encoded size of the largest request within l (its
// defaults filled in) whose values are at most MaxValueBytes long, as a
// protobuf encoder (Envoy's) writes it: every field once, every number at
// its longest varint. Each field is its tag (1 byte), its length (a
// varint) and its bytes; with the defaults:
//
//	entry       key 1+2+256 + value 1+2+1,024                     =     1,286
//	descriptor  16 entries × (1+2+1,286)                          =    20,624
//	            + limit 1+1+16: requests_per_unit 1+5, unit 1+1,
//	              unit_multiplier 1+1+(1+5)                       +        18
//	            + hits_addend 1+1+(1+10) + is_negative_hits 1+1   +        15
//	request     domain 1+2+256 + hits_addend 1+5                  =       265
//	            + 64 descriptors × (1+3+20,657)                   + 1,322,304
//	                                                              = 1,322,569
//
// about 1.3 MB. A longer request is over the limits, or carries values over
// MaxValueBytes (valid: each is counted under its digest, but together
// they must fit), or fields a newer Envoy knows and this service does not,
// or a field twice. The result is at most math.MaxInt32 (gRPC's length
// prefix is 32 bits), whatever the limits.
func (l *RequestLimits) maxRequestBytes() int {
	const most = math.MaxInt32
	// Every term is kept at most most, so that no product overflows.
	bytes := func(num protowire.Number, n int64) int64 {
		return min(int64(protowire.SizeTag(num)+protowire.SizeVarint(uint64(n)))+n, most)
	}
	varint := func(num protowire.Number, v uint64) int64 {
		return int64(protowire.SizeTag(num) + protowire.SizeVarint(v))
	}
	times := func(k int, n int64) int64 { return min(int64(min(k, most))*min(n, most), most) }
	entry := bytes(fieldKey, int64(min(l.MaxKeyBytes, most))) + bytes(fieldValue, int64(min(l.MaxValueBytes, most)))
	override := varint(fieldRequestsPerUnit, math.MaxUint32) +
		varint(fieldUnit, uint64(typev3.RateLimitUnit_YEAR)) +
		bytes(fieldUnitMultiplier, varint(fieldWrapperValue, math.MaxUint32))
	desc := times(l.MaxEntries, bytes(fieldEntries, entry)) +
		bytes(fieldLimit, override) +
		bytes(fieldDescHitsAddend, varint(fieldWrapperValue, math.MaxUint64)) +
		varint(fieldIsNegativeHits, 1)
	req := bytes(fieldDomain, int64(min(l.MaxDomainBytes, most))) +
		varint(fieldHitsAddend, math.MaxUint32) +
		times(l.MaxDescriptors, bytes(fieldDescriptors, desc))
	return int(min(req, most))
}

var errWire = errors.New("malformed")

// findInvalidUTF8 walks the wire form of a RateLimitRequest and returns the
// path of the first string field that is not valid UTF-8, or "".
func findInvalidUTF8(b []byte) string {
	di := 0
	var path string
	_ = walkFields(b, func(num protowire.Number, v []byte) error {
		switch num {
		case fieldDomain:
			if !utf8.Valid(v) {
				path = "domain"
				return errWire
			}
		case fieldDescriptors:
			ei := 0
			_ = walkFields(v, func(num protowire.Number, v []byte) error {
				if num != fieldEntries {
					return nil
				}
				_ = walkFields(v, func(num protowire.Number, v []byte) error {
					if (num == fieldKey || num == fieldValue) && !utf8.Valid(v) {
						name := "key"
						if num == fieldValue {
							name = "value"
						}
						path = fmt.Sprintf("descriptors[%d].entries[%d].%s", di, ei, name)
						return errWire
					}
					return nil
				})
				ei++
				if path != "" {
					return errWire
				}
				return nil
			})
			di++
			if path != "" {
				return errWire
			}
		}
		return nil
	})
	return path
}

// walkFields calls fn with every length-delimited field of the message b and
// skips the others. It stops at the first error of fn or of the wire format.
func walkFields(b []byte, fn func(protowire.Number, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		if typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return errWire
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		if err := fn(num, v); err != nil {
			return err
		}
	}
	return nil
}
