package resourcebroker

// SetActivateOnChanges turns the informer-driven retries on reservation and
// virtual-node changes on or off and returns the previous setting.
func SetActivateOnChanges(on bool) bool { return activateOnChanges.Swap(on) }
