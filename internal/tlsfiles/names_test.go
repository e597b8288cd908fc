package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"testing"
)

// TestVerifyClientNames: a name is accepted as a host name or IP address
// the certificate is valid for (wildcards included), or as one of its URIs
// or e-mail addresses exactly.
func TestVerifyClientNames(t *testing.T) {
	spiffe, err := url.Parse("spiffe://cluster.local/ns/edge/sa/envoy")
	if err != nil {
		t.Fatal(err)
	}
	cert := &x509.Certificate{
		DNSNames:       []string{"*.edge.internal", "envoy"},
		IPAddresses:    []net.IP{net.IPv4(10, 0, 3, 7)},
		URIs:           []*url.URL{spiffe},
		EmailAddresses: []string{"gateway@example.com"},
	}
	cs := tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
	for _, tc := range []struct {
		names []string
		ok    bool
	}{
		{[]string{"envoy"}, true},
		{[]string{"gw-1.edge.internal"}, true}, // the wildcard
		{[]string{"edge.internal"}, false},     // a wildcard covers one label
		{[]string{"a.b.edge.internal"}, false},
		{[]string{"10.0.3.7"}, true},
		{[]string{"10.0.3.8"}, false},
		{[]string{"spiffe://cluster.local/ns/edge/sa/envoy"}, true},
		{[]string{"spiffe://cluster.local/ns/edge/sa/other"}, false},
		{[]string{"gateway@example.com"}, true},
		{[]string{"other", "gateway@example.com"}, true},
		{[]string{"other"}, false},
	} {
		err := verifyClientNames(tc.names)(cs)
		if (err == nil) != tc.ok {
			t.Errorf("names %v: %v, want accepted %v", tc.names, err, tc.ok)
		}
	}
	if err := verifyClientNames([]string{"envoy"})(tls.ConnectionState{}); err == nil {
		t.Error("a connection without a client certificate was accepted")
	}
}

// TestVerifyClientNamesByType: a name is compared with the SANs of its own
// type only, so a SAN of another type that holds the same text does not
// pass (a review's finding: a SPIFFE ID written as a DNS name, even in
// another case, an e-mail address as a DNS name, a host name as an e-mail
// address or a relative URI, all passed).
func TestVerifyClientNamesByType(t *testing.T) {
	const spiffe = "spiffe://cluster.local/ns/edge/sa/envoy"
	relative, err := url.Parse("envoy.edge.internal")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		name string
		cert *x509.Certificate
	}{
		{"a SPIFFE ID as a DNS name", spiffe, &x509.Certificate{DNSNames: []string{spiffe}}},
		{"a SPIFFE ID as a DNS name, in capitals", spiffe, &x509.Certificate{DNSNames: []string{"SPIFFE://CLUSTER.LOCAL/NS/EDGE/SA/ENVOY"}}},
		{"an e-mail address as a DNS name", "envoy@edge.internal", &x509.Certificate{DNSNames: []string{"envoy@edge.internal"}}},
		{"a host name as an e-mail address", "envoy.edge.internal", &x509.Certificate{EmailAddresses: []string{"envoy.edge.internal"}}},
		{"a host name as a relative URI", "envoy.edge.internal", &x509.Certificate{URIs: []*url.URL{relative}}},
	} {
		cs := tls.ConnectionState{PeerCertificates: []*x509.Certificate{tc.cert}}
		if err := verifyClientNames([]string{tc.name})(cs); err == nil {
			t.Errorf("%s: %q accepted", tc.what, tc.name)
		}
	}
	// IPv6 addresses hold colons and are no URIs.
	v6 := &x509.Certificate{IPAddresses: []net.IP{net.ParseIP("fd00::7")}}
	if err := verifyClientNames([]string{"fd00::7"})(tls.ConnectionState{PeerCertificates: []*x509.Certificate{v6}}); err != nil {
		t.Errorf("an IPv6 SAN: %v", err)
	}
}
