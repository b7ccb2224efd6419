package model

import (
	"errors"
)

// ErrInvalid means an advertisement contradicts itself (e.g. more allocated
// than allocatable): the caller must fix it.
var ErrInvalid = errors.New("invalid advertisement")

// BoundError is an advertisement outside the bounds the operator set for
// its cluster (broker/policy): nothing was stored.
type BoundError struct {
	// Bound names the operator's setting, e.g.
	// "providers.clusters.paris.maxAllocatable.cpu".
	Bound   string
	Message string // what was advertised against what the bound allows
}

func (e *BoundError) Error() string {
	return e.Message + " (operator bound " + e.Bound + ")"
}
