// Package builtin holds the built-in actions that the default executor
// hosts: read_url and web_search behind a network guard, workspace file
// actions over a sandboxed root, and a read-only SQLite query. Each comes
// with its schemas, permission metadata and audit policy.
//
// It is not a browser or a shell: pages are fetched with plain HTTP GET or
// HEAD, files are read and written only under the configured root, and SQL
// only reads.
package builtin

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// ErrAddressRefused is returned (wrapped) when the guard refuses to dial a
// private, loopback, link-local or unspecified address.
var ErrAddressRefused = errors.New("address refused by the network guard")

// NetGuard decides which addresses network actions may reach: public
// unicast addresses only, unless Allow lists a prefix. It checks the
// address actually dialled, after DNS, on every connection (redirects
// included), so a hostname that resolves to 127.0.0.1 is refused like the
// literal.
type NetGuard struct {
	// Allow lists prefixes that may be reached even though they are not
	// public (e.g. 127.0.0.1/32 for tests, 10.1.0.0/16 for an internal
	// search service).
	Allow []netip.Prefix
}

// ParseAllow reads a comma-separated list of prefixes or addresses.
func ParseAllow(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		if s == "" {
			continue
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("builtin: allow-list entry %q is neither an address nor a prefix", s)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// cgnat is the shared address space of carrier-grade NAT (RFC 6598).
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// specialPurpose are ranges that are global unicast to net/netip yet never
// a public destination: translation and tunnelling prefixes that embed an
// IPv4 address (and so can reach a private or loopback one), and ranges
// reserved for documentation, benchmarking or future use (IANA special-
// purpose address registries).
var specialPurpose = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "\"this network\""},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignment"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible (deprecated)"},
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local NAT64"},
	{netip.MustParsePrefix("100::/64"), "discard-only"},
	{netip.MustParsePrefix("2001::/32"), "Teredo"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	{netip.MustParsePrefix("2002::/16"), "6to4"},
	{netip.MustParsePrefix("fec0::/10"), "site-local (deprecated)"},
}

// specialPurposeReason returns why addr is in a special-purpose range, or
// "" when it is not.
func specialPurposeReason(addr netip.Addr) string {
	for _, r := range specialPurpose {
		if r.prefix.Contains(addr) {
			return r.why
		}
	}
	return ""
}

// Check returns nil when addr may be dialled.
func (g NetGuard) Check(addr netip.Addr) error {
	addr = addr.Unmap() // ::ffff:127.0.0.1 is 127.0.0.1
	for _, p := range g.Allow {
		if p.Contains(addr) {
			return nil
		}
	}
	var why string
	switch {
	case addr.IsLoopback():
		why = "loopback"
	case addr.IsUnspecified():
		why = "unspecified"
	case addr.IsPrivate():
		why = "private"
	case addr.IsLinkLocalUnicast(), addr.IsLinkLocalMulticast():
		why = "link-local"
	case addr.IsMulticast(), addr.IsInterfaceLocalMulticast():
		why = "multicast"
	case cgnat.Contains(addr):
		why = "shared (CGNAT)"
	case specialPurposeReason(addr) != "":
		why = specialPurposeReason(addr)
	case !addr.IsGlobalUnicast():
		why = "not global unicast"
	default:
		return nil
	}
	return fmt.Errorf("%w: %s is a %s address", ErrAddressRefused, addr, why)
}

func (g NetGuard) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot parse %q", ErrAddressRefused, address)
	}
	return g.Check(ap.Addr())
}

// Client returns an HTTP client whose every connection goes through the
// guard. It uses no proxy (a proxy would hide the dialled address) and
// follows at most maxRedirects redirects.
func (g NetGuard) Client(maxRedirects int) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, Control: g.control}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          32,
		IdleConnTimeout:       60 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
	}
	return &http.Client{Transport: tr, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) > maxRedirects {
			return fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		return nil
	}}
}
