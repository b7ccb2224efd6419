package testbed

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is one subprocess of the bed (redis-server, a broker replica, an
// agent, a scheduler). Its output goes to LogPath, appended across restarts
// with a header line per start, so a log tells the whole story of a run.
type Process struct {
	Name    string
	Path    string
	Args    []string
	Env     []string // added to the bed's environment
	LogPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the current run has ended
	err  error         // how it ended, once done is closed
}

// Start runs the process; it fails if it is already running.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !closed(p.done) {
		return fmt.Errorf("%s is already running", p.Name)
	}
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "=== %s: start %s %s\n", time.Now().Format(time.RFC3339Nano), p.Path, strings.Join(p.Args, " "))
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(logf, "=== %s: exited: %v\n", time.Now().Format(time.RFC3339Nano), err)
		logf.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Running reports whether the process runs now.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !closed(p.done)
}

// Exited is closed when the current run ends (nil before the first Start).
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Err is how the last run ended (nil while running).
func (p *Process) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Pid of the current run (0 if none).
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Stop asks the process to end (SIGTERM) and kills it after grace.
func (p *Process) Stop(grace time.Duration) error {
	return p.signal(syscall.SIGTERM, grace)
}

// Freeze stops the process (SIGSTOP): it holds its sockets and answers
// nothing, as a hung server or a host cut off does. Thaw resumes it.
func (p *Process) Freeze() error { return p.send(syscall.SIGSTOP) }

// Thaw resumes a frozen process (SIGCONT).
func (p *Process) Thaw() error { return p.send(syscall.SIGCONT) }

func (p *Process) send(sig syscall.Signal) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || closed(done) {
		return fmt.Errorf("%s is not running", p.Name)
	}
	return cmd.Process.Signal(sig)
}

// Kill ends the process at once (SIGKILL), as a crash would.
func (p *Process) Kill() error {
	return p.signal(syscall.SIGKILL, 10*time.Second)
}

func (p *Process) signal(sig syscall.Signal, grace time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || closed(done) {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return nil
	case <-time.After(grace):
	}
	_ = cmd.Process.Kill()
	select {
	case <-done:
		return fmt.Errorf("%s did not stop within %s after %s; killed", p.Name, grace, sig)
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) survives SIGKILL", p.Name, cmd.Process.Pid)
	}
}

// Tail returns the last n lines of the process's log.
func (p *Process) Tail(n int) string { return TailFile(p.LogPath, n) }

// portInUse tells from the log whether the last run failed to bind a port.
func (p *Process) portInUse() bool {
	return strings.Contains(p.Tail(40), "address already in use")
}

func closed(ch chan struct{}) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TailFile returns the last n lines of a file (or why there are none).
func TailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// FreePorts returns n distinct free loopback ports. Another process may take
// one before it is bound: callers retry a start that failed to bind.
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// errExited says a process ended while the bed waited for it to be ready.
var errExited = errors.New("exited before it was ready")
