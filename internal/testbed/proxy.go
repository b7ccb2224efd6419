package testbed

import (
	"io"
	"net"
	"sync"
	"time"
)

// Proxy is a TCP round-robin load balancer in front of the broker replicas,
// the bed's stand-in for a Kubernetes Service: each new connection goes to
// the next replica that accepts it, and TLS passes through untouched (the
// broker's certificate names 127.0.0.1, where the proxy listens). When a
// replica dies its connections close, and the agents' retries land on
// another replica.
type Proxy struct {
	Addr string

	ln       net.Listener
	mu       sync.Mutex
	backends []string
	next     int
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
	counts   map[string]int
	active   map[int]string   // client's port -> backend, for open connections
	clients  map[int]net.Conn // client's port -> its connection
	// refuse, when set, tells the client ports whose connections are
	// closed at once (Bed.CutFromBroker).
	refuse func(clientPort int) bool
}

func newProxy(backends []string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, backends: backends, conns: map[net.Conn]struct{}{}, counts: map[string]int{},
		active: map[int]string{}, clients: map[int]net.Conn{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Connections returns how many connections went to each backend so far.
func (p *Proxy) Connections() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.counts))
	for k, v := range p.counts {
		out[k] = v
	}
	return out
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

func (p *Proxy) handle(client net.Conn) {
	p.mu.Lock()
	refuse := p.refuse
	p.mu.Unlock()
	if refuse != nil && refuse(client.RemoteAddr().(*net.TCPAddr).Port) {
		client.Close()
		return
	}
	p.mu.Lock()
	n, start := len(p.backends), p.next
	p.next++
	p.mu.Unlock()
	var backend net.Conn
	var addr string
	for i := range n {
		addr = p.backends[(start+i)%n]
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			backend = c
			break
		}
	}
	if backend == nil {
		client.Close()
		return
	}
	if !p.track(client, backend, addr) {
		return
	}
	defer p.untrack(client, backend)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Half-close so the peer sees the end; a reset or EOF from either
		// side ends both directions soon after.
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(backend, client)
	go pipe(client, backend)
	<-done
	// One side ended: give the other a moment to drain, then close both.
	select {
	case <-done:
	case <-time.After(time.Second):
	}
}

func (p *Proxy) track(client, backend net.Conn, addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil { // closed
		client.Close()
		backend.Close()
		return false
	}
	p.conns[client], p.conns[backend] = struct{}{}, struct{}{}
	p.counts[addr]++
	p.active[client.RemoteAddr().(*net.TCPAddr).Port] = addr
	p.clients[client.RemoteAddr().(*net.TCPAddr).Port] = client
	return true
}

func (p *Proxy) untrack(client, backend net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.active, client.RemoteAddr().(*net.TCPAddr).Port)
	delete(p.clients, client.RemoteAddr().(*net.TCPAddr).Port)
	for _, c := range []net.Conn{client, backend} {
		c.Close()
		delete(p.conns, c)
	}
}

// setRefuse makes the proxy refuse the client ports refuse names (nil:
// none), and closes their open connections.
func (p *Proxy) setRefuse(refuse func(clientPort int) bool) {
	p.mu.Lock()
	p.refuse = refuse
	var open []net.Conn
	for port, c := range p.clients {
		if refuse != nil && refuse(port) {
			open = append(open, c)
		}
	}
	p.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

// backendOf returns the backend of the open connection from a client port.
func (p *Proxy) backendOf(clientPort int) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.active[clientPort]
	return b, ok
}

// Close stops accepting and closes every connection.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
