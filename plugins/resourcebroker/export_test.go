package resourcebroker

import fwk "k8s.io/kube-scheduler/framework"

// SetHintsOnly turns the retries by plugin p's own informers (on
// reservation, virtual-node and pod changes) off (on=true) or back on, so
// that only the scheduler's queueing hints requeue pods; it returns the
// previous setting. p is a plugin New returned.
func SetHintsOnly(p fwk.Plugin, on bool) bool { return p.(*ResourceBroker).hintsOnly.Swap(on) }
