// Package api holds the broker's wire types (our v2 API and the seed agents'
// v1 protocol), their strict decoding and validation, and their conversion to
// the store's integer units. Everything a client sends is checked here, before
// anything reaches Redis.
package api

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// Quantities is an amount of resources as Kubernetes quantity strings, the
// same JSON in v1 and v2: {"cpu": "500m", "memory": "1Gi", "gpu": "1", "storage": "10Gi"}.
type Quantities struct {
	CPU     *resource.Quantity `json:"cpu,omitempty"`
	Memory  *resource.Quantity `json:"memory,omitempty"`
	GPU     *resource.Quantity `json:"gpu,omitempty"`
	Storage *resource.Quantity `json:"storage,omitempty"`
}

// ToResources converts to integer units (millicores, bytes, devices, bytes);
// absent amounts are zero. Negative amounts, fractional GPUs and amounts
// above model.MaxAmount (which the scripts could not hold exactly) are
// errors naming the field.
func (q Quantities) ToResources(field string) (model.Resources, error) {
	var out model.Resources
	var err error
	if out.CPU, err = amount(field, "cpu", q.CPU); err != nil {
		return out, err
	}
	if out.Memory, err = amount(field, "memory", q.Memory); err != nil {
		return out, err
	}
	if out.GPU, err = amount(field, "gpu", q.GPU); err != nil {
		return out, err
	}
	if q.GPU != nil && q.GPU.MilliValue()%1000 != 0 {
		return out, fmt.Errorf("%s.gpu: must be a whole number of devices, got %s", field, q.GPU)
	}
	if out.Storage, err = amount(field, "storage", q.Storage); err != nil {
		return out, err
	}
	return out, nil
}

// amount converts q, resource res of field, to the store's unit of res
// (rounded up, as Kubernetes does). The bound is compared as a quantity,
// before any conversion: a huge quantity's value would overflow int64.
func amount(field, res string, q *resource.Quantity) (int64, error) {
	if q == nil {
		return 0, nil
	}
	if q.Sign() < 0 {
		return 0, fmt.Errorf("%s.%s: must not be negative, got %s", field, res, q)
	}
	if most := model.MaxQuantity(res); q.Cmp(most) > 0 {
		return 0, fmt.Errorf("%s.%s: %s is above the largest amount the broker holds exactly (%s)", field, res, q, &most)
	}
	if res == "cpu" {
		return q.MilliValue(), nil
	}
	return q.Value(), nil
}

// FromResources converts integer units back to quantities; cpu and memory are
// always present, gpu and storage only when non-zero.
func FromResources(r model.Resources) Quantities {
	q := Quantities{
		CPU:    resource.NewMilliQuantity(r.CPU, resource.DecimalSI),
		Memory: resource.NewQuantity(r.Memory, resource.BinarySI),
	}
	if r.GPU != 0 {
		q.GPU = resource.NewQuantity(r.GPU, resource.DecimalSI)
	}
	if r.Storage != 0 {
		q.Storage = resource.NewQuantity(r.Storage, resource.BinarySI)
	}
	return q
}
