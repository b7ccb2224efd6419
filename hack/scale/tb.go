package main

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"k8s.io/klog/v2"
)

// programTB lets a program use internal/brokertest, which is written for
// tests: it starts redis-server and rb-broker processes the way the tests
// do and reports failures through a testing.TB. Failures are logged, a fatal
// one aborts the set-up (panic errFatal, recovered by run, which then runs
// the cleanups: the child processes are stopped), and cleanups run last
// first when the run ends. Any testing.TB method it does not define panics
// (the embedded interface is nil): brokertest does not call them.
type programTB struct {
	testing.TB

	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

// errFatal is the panic value of a fatal failure.
type errFatal struct{ msg string }

func (t *programTB) Helper()                 {}
func (t *programTB) Name() string            { return "rb-scale" }
func (t *programTB) Log(args ...any)         { klog.V(4).Info(fmt.Sprint(args...)) }
func (t *programTB) Logf(f string, a ...any) { klog.V(4).Info(fmt.Sprintf(f, a...)) }
func (t *programTB) Error(args ...any)       { t.fail(fmt.Sprint(args...)) }
func (t *programTB) Errorf(f string, a ...any) {
	t.fail(fmt.Sprintf(f, a...))
}
func (t *programTB) Fatal(args ...any)         { t.Error(args...); t.FailNow() }
func (t *programTB) Fatalf(f string, a ...any) { t.Errorf(f, a...); t.FailNow() }
func (t *programTB) Fail()                     { t.fail("failed") }
func (t *programTB) FailNow()                  { panic(errFatal{"set-up failed (see the errors above)"}) }

func (t *programTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *programTB) fail(msg string) {
	klog.ErrorS(nil, msg)
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}

func (t *programTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// TempDir is a fresh directory removed at cleanup.
func (t *programTB) TempDir() string {
	dir, err := os.MkdirTemp("", "rb-scale-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// runCleanups runs the cleanups, the last registered first.
func (t *programTB) runCleanups() {
	for {
		t.mu.Lock()
		if len(t.cleanups) == 0 {
			t.mu.Unlock()
			return
		}
		f := t.cleanups[len(t.cleanups)-1]
		t.cleanups = t.cleanups[:len(t.cleanups)-1]
		t.mu.Unlock()
		f()
	}
}
