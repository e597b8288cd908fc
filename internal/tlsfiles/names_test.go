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
