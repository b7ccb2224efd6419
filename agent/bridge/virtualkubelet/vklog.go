package virtualkubelet

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
)

// withVKLogger routes virtual-kubelet's logging (log.G(ctx)) to logr:
// debug at V(2), info at V(1) (it is chatty), warnings as info, errors as errors.
func withVKLogger(ctx context.Context, l logr.Logger) context.Context {
	return vklog.WithLogger(ctx, vkLogger{l})
}

type vkLogger struct{ l logr.Logger }

var _ vklog.Logger = vkLogger{}

func (v vkLogger) Debug(a ...any)            { v.l.V(2).Info(fmt.Sprint(a...)) }
func (v vkLogger) Debugf(f string, a ...any) { v.l.V(2).Info(fmt.Sprintf(f, a...)) }
func (v vkLogger) Info(a ...any)             { v.l.V(1).Info(fmt.Sprint(a...)) }
func (v vkLogger) Infof(f string, a ...any)  { v.l.V(1).Info(fmt.Sprintf(f, a...)) }
func (v vkLogger) Warn(a ...any)             { v.l.Info(fmt.Sprint(a...), "level", "warning") }
func (v vkLogger) Warnf(f string, a ...any)  { v.l.Info(fmt.Sprintf(f, a...), "level", "warning") }
func (v vkLogger) Error(a ...any)            { v.l.Error(nil, fmt.Sprint(a...)) }
func (v vkLogger) Errorf(f string, a ...any) { v.l.Error(nil, fmt.Sprintf(f, a...)) }
func (v vkLogger) Fatal(a ...any)            { v.l.Error(nil, fmt.Sprint(a...), "level", "fatal") }
func (v vkLogger) Fatalf(f string, a ...any) { v.l.Error(nil, fmt.Sprintf(f, a...), "level", "fatal") }
func (v vkLogger) WithField(k string, val any) vklog.Logger {
	return vkLogger{v.l.WithValues(k, fmt.Sprint(val))}
}

func (v vkLogger) WithFields(f vklog.Fields) vklog.Logger {
	kv := make([]any, 0, 2*len(f))
	for k, val := range f {
		kv = append(kv, k, fmt.Sprint(val))
	}
	return vkLogger{v.l.WithValues(kv...)}
}

func (v vkLogger) WithError(err error) vklog.Logger {
	if err == nil {
		return v
	}
	return vkLogger{v.l.WithValues("error", err.Error())}
}
