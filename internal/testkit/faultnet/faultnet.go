// Package faultnet is a fault-injecting TCP proxy for tests.
//
// It is test tooling: a loopback TCP proxy that sits between a client and a server
// and injects the faults a network and a sick server produce — added latency, connections reset
// before or in the middle of an answer, requests that are never answered, and a port that
// refuses connections. The end-to-end fault tests put it in front of an upstream (or a store) and
// switch faults while the gateway runs.
//
// It is not used by the gateway itself. Faults act on request boundaries rather than on
// connections: the fault in force when a chunk of bytes arrives from the client decides what
// happens to that chunk and to the answer that follows it, so a fault takes effect on the next
// request even over a keep-alive connection that was opened before it was set.
package faultnet

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is what the proxy does with the bytes a client sends.
type Mode uint8

const (
	// Pass forwards both ways, after Fault.Delay. It is the zero Mode.
	Pass Mode = iota
	// Reset resets the client's connection (TCP RST) when it sends, without forwarding.
	Reset
	// Stall reads and discards what the client sends and never answers, until the client or the
	// proxy closes the connection.
	Stall
	// ResetAfter forwards the request, passes the first Fault.After bytes of the answer, then
	// resets the client's connection: a server that dies in the middle of a response.
	ResetAfter
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Reset:
		return "reset"
	case Stall:
		return "stall"
	case ResetAfter:
		return "reset-after"
	default:
		return fmt.Sprintf("Mode(%d)", m)
	}
}

// Fault is the behaviour in force. The zero Fault passes everything at once.
type Fault struct {
	Mode Mode
	// Delay holds each chunk the client sends for this long before forwarding it (Pass and
	// ResetAfter): a slow network or a slow server.
	Delay time.Duration
	// After is how many bytes of the answer ResetAfter lets through.
	After int64
}

// Proxy forwards connections accepted on a loopback port to a target address, applying the Fault
// in force. Its methods are safe for concurrent use. Create it with New; the zero Proxy is not
// usable.
type Proxy struct {
	target string
	addr   string

	fault atomic.Pointer[Fault]

	mu      sync.Mutex
	ln      net.Listener // nil while refusing
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
	accepts atomic.Int64
}

// New listens on a free loopback port and forwards to target (host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultnet: listen: %w", err)
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.fault.Store(&Fault{})
	p.start(ln)
	return p, nil
}

// Addr is the proxy's host:port. It does not change across Refuse and Listen.
func (p *Proxy) Addr() string { return p.addr }

// Accepted is the number of client connections accepted so far.
func (p *Proxy) Accepted() int64 { return p.accepts.Load() }

// Set puts f in force for every chunk that arrives from now on.
func (p *Proxy) Set(f Fault) { p.fault.Store(&f) }

// Refuse closes the listening port, so that new connections are refused, and resets every open
// connection: a process that died.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	for _, c := range conns {
		reset(c)
	}
}

// Listen opens the port again after Refuse: the process restarted. It fails when another process
// took the port meanwhile.
func (p *Proxy) Listen() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("faultnet: proxy closed")
	}
	if p.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("faultnet: listen again on %s: %w", p.addr, err)
	}
	p.startLocked(ln)
	return nil
}

// Close stops listening, closes every connection and waits for the proxy's goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Refuse()
	p.wg.Wait()
	return nil
}

func (p *Proxy) start(ln net.Listener) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.startLocked(ln)
}

func (p *Proxy) startLocked(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go p.accept(ln)
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed by Refuse or Close
		}
		p.accepts.Add(1)
		if !p.track(c) {
			reset(c)
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// track registers c; it returns false when the proxy is refusing or closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.ln == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// serve pumps one client connection. The server side is dialled lazily, on the first chunk that
// is to be forwarded, so that Reset and Stall never reach the target.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	defer client.Close()

	var (
		server net.Conn
		back   sync.WaitGroup
		limit  atomic.Int64 // answer bytes still allowed through; -1: no limit
	)
	limit.Store(-1)
	defer func() {
		if server != nil {
			_ = server.Close()
		}
		back.Wait()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			f := *p.fault.Load()
			switch f.Mode {
			case Reset:
				reset(client)
				return
			case Stall:
				continue
			case ResetAfter:
				limit.Store(f.After)
			default:
				limit.Store(-1)
			}
			if f.Delay > 0 {
				t := time.NewTimer(f.Delay)
				<-t.C
			}
			if server == nil {
				if server, err = net.DialTimeout("tcp", p.target, 5*time.Second); err != nil {
					server = nil
					reset(client)
					return
				}
				p.mu.Lock()
				p.conns[server] = struct{}{}
				p.mu.Unlock()
				back.Add(1)
				go func(server net.Conn) {
					defer back.Done()
					defer p.untrack(server)
					pumpBack(client, server, &limit)
				}(server)
			}
			if _, werr := server.Write(buf[:n]); werr != nil {
				reset(client)
				return
			}
		}
		if err != nil {
			if server != nil && errors.Is(err, io.EOF) {
				// The client half-closed: pass that on and let the answer finish.
				if tc, ok := server.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
					back.Wait()
				}
			}
			return
		}
	}
}

// pumpBack copies the answer to the client, resetting the client once limit (when not -1) bytes
// have passed.
func pumpBack(client, server net.Conn, limit *atomic.Int64) {
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if l := limit.Load(); l >= 0 {
				if int64(len(chunk)) >= l {
					if l > 0 {
						_, _ = client.Write(chunk[:l])
					}
					reset(client)
					_ = server.Close()
					return
				}
				limit.Store(l - int64(len(chunk)))
			}
			if _, werr := client.Write(chunk); werr != nil {
				_ = server.Close()
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if tc, ok := client.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
					return
				}
			}
			_ = client.Close()
			return
		}
	}
}

// reset closes c with a TCP RST instead of a FIN, as a crashed process or a middlebox does.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
