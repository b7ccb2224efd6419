package model

import (
	"errors"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
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

// Quantity renders an amount of a resource ("cpu", "memory", "storage";
// anything else is a count) as the API writes it: 1500m, 4Gi, 2.
func Quantity(res string, v int64) string {
	switch res {
	case "cpu":
		return resource.NewMilliQuantity(v, resource.DecimalSI).String()
	case "memory", "storage":
		return resource.NewQuantity(v, resource.BinarySI).String()
	}
	return strconv.FormatInt(v, 10)
}
