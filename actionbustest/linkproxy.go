package actionbustest

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// LinkProxy is a TCP link a test can cut: it forwards connections on
// loopback to a target (a hub's leaf node port, a server's client port)
// until [LinkProxy.Cut], which closes every connection and refuses new
// ones until [LinkProxy.Restore]. It is closed in t.Cleanup.
type LinkProxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	down     bool
	conns    []net.Conn
	accepted int
}

// NewLinkProxy starts a link to target on a free loopback port.
func NewLinkProxy(t testing.TB, target string) *LinkProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("actionbustest: link proxy: %v", err)
	}
	p := &LinkProxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.Cut()
	})
	return p
}

// Addr is the address to connect to instead of the target.
func (p *LinkProxy) Addr() string { return p.ln.Addr().String() }

func (p *LinkProxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			_ = in.Close()
			continue
		}
		out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			p.mu.Unlock()
			_ = in.Close()
			continue
		}
		p.conns = append(p.conns, in, out)
		p.accepted++
		p.mu.Unlock()
		go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
		go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
	}
}

// Cut closes every connection of the link and refuses new ones.
func (p *LinkProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// Restore accepts connections again.
func (p *LinkProxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// Accepted is how many connections the link has carried.
func (p *LinkProxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}
