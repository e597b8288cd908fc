package rls

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// FormatResponse writes resp for people, as `envoy-rls query` prints it:
// the overall code, a table with one row per descriptor status (code, limit,
// remaining, reset), then the headers, the body and the metadata. For
// example:
//
//	overall: OVER_LIMIT
//	#  CODE        LIMIT       NAME    REMAINING  RESET
//	0  OVER_LIMIT  2/second    burst   0          400ms
//	1  OK          -           -       -          -
//	headers:
//	  RateLimit-Policy: "burst";q=2;w=1
//	  ...
//
// The metadata is read with Metadata, so resp may be a decoded response or
// one that ShouldRateLimit returned in the process.
func FormatResponse(w io.Writer, resp *rlsv3.RateLimitResponse) error {
	md, err := Metadata(resp)
	if err != nil {
		return fmt.Errorf("formatting the response: %w", err)
	}
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "overall: %v\n", resp.GetOverallCode())
	tw := tabwriter.NewWriter(bw, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tCODE\tLIMIT\tNAME\tREMAINING\tRESET")
	for i, st := range resp.GetStatuses() {
		cl := st.GetCurrentLimit()
		if cl == nil {
			fmt.Fprintf(tw, "%d\t%v\t-\t-\t-\t-\n", i, st.GetCode())
			continue
		}
		name := cl.GetName()
		if name == "" {
			name = "-"
		}
		fmt.Fprintf(tw, "%d\t%v\t%s\t%s\t%d\t%v\n", i, st.GetCode(), FormatLimit(cl), name,
			st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration().Round(time.Millisecond))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if hs := resp.GetResponseHeadersToAdd(); len(hs) > 0 {
		fmt.Fprintln(bw, "headers:")
		for _, h := range hs {
			fmt.Fprintf(bw, "  %s: %s\n", h.GetKey(), h.GetValue())
		}
	}
	if b := resp.GetRawBody(); len(b) > 0 {
		fmt.Fprintf(bw, "body: %s\n", b)
	}
	if md != nil && len(md.Fields) > 0 {
		fmt.Fprintln(bw, "metadata:")
		keys := make([]string, 0, len(md.Fields))
		for k := range md.Fields {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(bw, "  %s: %s\n", k, formatValue(md.Fields[k]))
		}
	}
	return bw.Flush()
}

// FormatLimit writes a current_limit as "120/minute", "90/90 seconds" style:
// "<requests>/<unit>" or "<requests>/<multiplier> <unit>s".
func FormatLimit(cl *rlsv3.RateLimitResponse_RateLimit) string {
	unit := strings.ToLower(cl.GetUnit().String())
	if m := cl.GetUnitMultiplier(); m != nil && m.Value > 1 {
		return fmt.Sprintf("%d/%d %ss", cl.GetRequestsPerUnit(), m.Value, unit)
	}
	return fmt.Sprintf("%d/%s", cl.GetRequestsPerUnit(), unit)
}

func formatValue(v *structpb.Value) string {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return k.StringValue
	case *structpb.Value_NumberValue:
		return strconv.FormatFloat(k.NumberValue, 'f', -1, 64) // 4999999, not 4.999999e+06
	case *structpb.Value_BoolValue:
		return fmt.Sprint(k.BoolValue)
	}
	b, _ := v.MarshalJSON()
	return string(b)
}
