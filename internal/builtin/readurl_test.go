package builtin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/internal/builtin"
)

const article = `<!doctype html><html><head><title>NATS JetStream explained</title></head><body>
<nav>Home | Docs | Blog</nav>
<article><h1>NATS JetStream explained</h1>
<p>JetStream is the persistence layer of NATS. It stores messages in streams and lets consumers replay them at their own pace.</p>
<p>Streams can be replicated across a cluster of servers, so acknowledged messages survive the loss of a node. Consumers track what they have processed.</p>
<p>Key-value buckets and object stores are built on the same streams, which keeps the operational model small and consistent.</p>
</article><footer>© example</footer></body></html>`

func pageServer(t *testing.T) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/article", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, article)
	})
	mux.HandleFunc("/data.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"jobs":[{"id":"j-1"}],"count":1}`)
	})
	mux.HandleFunc("/plain", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(w, "just text")
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(w, strings.Repeat("x", 5000))
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/article", http.StatusFound) })
	mux.HandleFunc("/redirect-private", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	mux.HandleFunc("/image.png", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/png")
		w.Write([]byte{0x89, 'P', 'N', 'G', 0, 1, 2})
	})
	mux.HandleFunc("/forbidden", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusForbidden) })
	mux.HandleFunc("/challenge", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, `<html><head><title>Attention Required! | Cloudflare</title></head><body><p>Please enable cookies.</p></body></html>`)
	})
	mux.HandleFunc("/empty", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, `<html><head></head><body><script>var x=1;</script></body></html>`)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func allowLoopback() builtin.NetGuard {
	return builtin.NetGuard{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
}

func TestReadURLModesAndFailures(t *testing.T) {
	srv := pageServer(t)
	r := builtin.NewURLReader(allowLoopback())
	ctx := context.Background()
	tests := []struct {
		name  string
		args  builtin.ReadURLArgs
		check func(t *testing.T, res builtin.ReadURLResult)
	}{
		{"auto html becomes readable text and a title", builtin.ReadURLArgs{URL: srv.URL + "/article"}, func(t *testing.T, res builtin.ReadURLResult) {
			require.True(t, res.OK, res.Error)
			assert.Equal(t, "html_text", res.Mode)
			assert.Equal(t, "NATS JetStream explained", res.Title)
			assert.Contains(t, res.Text, "JetStream is the persistence layer of NATS.")
			assert.NotContains(t, res.Text, "<p>")
			assert.Equal(t, 200, res.Status)
			assert.Equal(t, "OK", res.StatusText)
			assert.Equal(t, len(article), res.Bytes)
			assert.False(t, res.Truncated)
		}},
		{"text mode keeps the body", builtin.ReadURLArgs{URL: srv.URL + "/article", Mode: "text"}, func(t *testing.T, res builtin.ReadURLResult) {
			require.True(t, res.OK)
			assert.Contains(t, res.Text, "<p>JetStream")
		}},
		{"auto json", builtin.ReadURLArgs{URL: srv.URL + "/data.json"}, func(t *testing.T, res builtin.ReadURLResult) {
			require.True(t, res.OK)
			assert.Equal(t, "json", res.Mode)
			assert.Equal(t, map[string]any{"jobs": []any{map[string]any{"id": "j-1"}}, "count": 1.0}, res.JSON)
		}},
		{"json mode on a non-JSON body", builtin.ReadURLArgs{URL: srv.URL + "/plain", Mode: "json"}, func(t *testing.T, res builtin.ReadURLResult) {
			assert.False(t, res.OK)
			assert.Equal(t, builtin.ReasonUnsupportedContent, res.Reason)
		}},
		{"auto plain text", builtin.ReadURLArgs{URL: srv.URL + "/plain"}, func(t *testing.T, res builtin.ReadURLResult) {
			require.True(t, res.OK)
			assert.Equal(t, "text", res.Mode)
			assert.Equal(t, "just text", res.Text)
		}},
		{"HEAD reads no body", builtin.ReadURLArgs{URL: srv.URL + "/article", Method: "head"}, func(t *testing.T, res builtin.ReadURLResult) {
			require.True(t, res.OK)
			assert.Equal(t, 200, res.Status)
			assert.Equal(t, "text/html; charset=utf-8", res.ContentType)
			assert.Empty(t, res.Text)
			assert.Zero(t, res.Bytes)
		}},
		{"a body over the limit is truncated", builtin.ReadURLArgs{URL: srv.URL + "/big", MaxBytes: 1000}, func(t *testing.T, res builtin.ReadURLResult) {
			require.True(t, res.OK)
			assert.True(t, res.Truncated)
			assert.Equal(t, 1000, res.Bytes)
			assert.Len(t, res.Text, 1000)
		}},
		{"a redirect is followed", builtin.ReadURLArgs{URL: srv.URL + "/redirect"}, func(t *testing.T, res builtin.ReadURLResult) {
			require.True(t, res.OK)
			assert.Equal(t, srv.URL+"/article", res.FinalURL)
			assert.Equal(t, srv.URL+"/redirect", res.URL)
		}},
		{"a redirect to a private address is refused", builtin.ReadURLArgs{URL: srv.URL + "/redirect-private"}, func(t *testing.T, res builtin.ReadURLResult) {
			assert.False(t, res.OK)
			assert.Equal(t, builtin.ReasonAddressRefused, res.Reason)
			assert.Contains(t, res.Error, "169.254.169.254 is a link-local address")
		}},
		{"invalid URL", builtin.ReadURLArgs{URL: "ftp://example.com/x"}, func(t *testing.T, res builtin.ReadURLResult) {
			assert.Equal(t, builtin.ReasonInvalidURL, res.Reason)
			assert.Equal(t, "read_url_result", res.Kind)
		}},
		{"relative URL", builtin.ReadURLArgs{URL: "/just/a/path"}, func(t *testing.T, res builtin.ReadURLResult) {
			assert.Equal(t, builtin.ReasonInvalidURL, res.Reason)
		}},
		{"invalid method", builtin.ReadURLArgs{URL: srv.URL + "/article", Method: "POST"}, func(t *testing.T, res builtin.ReadURLResult) {
			assert.Equal(t, builtin.ReasonInvalidMethod, res.Reason)
		}},
		{"HTTP error", builtin.ReadURLArgs{URL: srv.URL + "/missing"}, func(t *testing.T, res builtin.ReadURLResult) {
			assert.Equal(t, builtin.ReasonHTTPError, res.Reason)
			assert.Equal(t, 404, res.Status)
		}},
		{"timeout", builtin.ReadURLArgs{URL: srv.URL + "/slow", TimeoutMs: 200}, func(t *testing.T, res builtin.ReadURLResult) {
			assert.Equal(t, builtin.ReasonTimeout, res.Reason)
		}},
		{"unsupported content type", builtin.ReadURLArgs{URL: srv.URL + "/image.png"}, func(t *testing.T, res builtin.ReadURLResult) {
			assert.Equal(t, builtin.ReasonUnsupportedContent, res.Reason)
			assert.Empty(t, res.Text, "no binary content")
		}},
		{"blocked page (403)", builtin.ReadURLArgs{URL: srv.URL + "/forbidden"}, func(t *testing.T, res builtin.ReadURLResult) {
			assert.Equal(t, builtin.ReasonBlockedPage, res.Reason)
		}},
		{"blocked page (challenge)", builtin.ReadURLArgs{URL: srv.URL + "/challenge"}, func(t *testing.T, res builtin.ReadURLResult) {
			assert.Equal(t, builtin.ReasonBlockedPage, res.Reason)
		}},
		{"empty readable content", builtin.ReadURLArgs{URL: srv.URL + "/empty"}, func(t *testing.T, res builtin.ReadURLResult) {
			assert.Equal(t, builtin.ReasonEmptyContent, res.Reason)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := r.Read(ctx, tt.args)
			assert.Equal(t, "read_url_result", res.Kind)
			tt.check(t, res)
		})
	}
}

func TestTheDefaultGuardRefusesPrivateAndLoopbackAddresses(t *testing.T) {
	srv := pageServer(t)
	port := srv.URL[strings.LastIndexByte(srv.URL, ':')+1:]
	r := builtin.NewURLReader(builtin.NetGuard{})
	for _, u := range []string{
		srv.URL + "/article",                    // 127.0.0.1
		"http://localhost:" + port + "/article", // a hostname resolving to loopback
		"http://[::1]:" + port + "/",
		"http://[::ffff:127.0.0.1]:" + port + "/",
		"http://0.0.0.0:" + port + "/",
		"http://[::]:" + port + "/",
		"http://[fe80::1]:" + port + "/",
		"http://169.254.169.254/latest/meta-data/",
		"http://10.0.0.1/",
		"http://172.16.5.4/",
		"http://192.168.1.1/",
		"http://100.64.0.1/",
		"http://[fd00::1]/",
		"http://[::ffff:10.0.0.1]/",
	} {
		t.Run(u, func(t *testing.T) {
			res := r.Read(context.Background(), builtin.ReadURLArgs{URL: u, TimeoutMs: 2000})
			assert.False(t, res.OK)
			assert.Equal(t, builtin.ReasonAddressRefused, res.Reason, res.Error)
		})
	}
	guard := builtin.NetGuard{}
	assert.NoError(t, guard.Check(netip.MustParseAddr("93.184.216.34")), "a public address passes")
	assert.NoError(t, guard.Check(netip.MustParseAddr("2606:4700::1111")), "a public IPv6 address passes")
	for addr, why := range map[string]string{
		"64:ff9b::7f00:1": "NAT64",           // 127.0.0.1 through NAT64
		"64:ff9b::a00:1":  "NAT64",           // 10.0.0.1 through NAT64
		"2002:7f00:1::1":  "6to4",            // 6to4 of 127.0.0.1
		"::7f00:1":        "IPv4-compatible", // ::127.0.0.1
		"::a00:1":         "IPv4-compatible", // ::10.0.0.1
		"fec0::1":         "site-local",
		"198.18.0.1":      "benchmarking",
		"198.19.255.255":  "benchmarking",
		"240.0.0.1":       "reserved",
		"255.255.255.255": "",
		"2001:0:4136::1":  "Teredo",
		"192.0.2.10":      "documentation",
		"2001:db8::1":     "documentation",
		"0.1.2.3":         "this network",
	} {
		err := guard.Check(netip.MustParseAddr(addr))
		if assert.ErrorIs(t, err, builtin.ErrAddressRefused, addr) {
			assert.Contains(t, err.Error(), why, addr)
		}
	}
	allow, err := builtin.ParseAllow([]string{"10.1.0.0/16", "127.0.0.1"})
	require.NoError(t, err)
	g := builtin.NetGuard{Allow: allow}
	assert.NoError(t, g.Check(netip.MustParseAddr("10.1.2.3")))
	assert.NoError(t, g.Check(netip.MustParseAddr("::ffff:127.0.0.1")), "mapped forms match the allow-list too")
	assert.Error(t, g.Check(netip.MustParseAddr("10.2.0.1")))
	_, err = builtin.ParseAllow([]string{"intranet"})
	assert.Error(t, err)
}
