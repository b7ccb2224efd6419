package model

import (
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
)

// MaxAmount is the largest amount of a resource the broker keeps, in the
// unit of Resources (millicores, bytes, devices): the Lua scripts compute in
// doubles, which hold every integer up to 2^53-1 exactly and then skip
// (2^53+1 is read as 2^53), so a larger amount would be stored rounded and
// the counters and the index would drift apart in their last digits.
const MaxAmount = 1<<53 - 1

// MaxQuantity is MaxAmount of resource res ("cpu", "memory", "gpu",
// "storage") as the API writes it: 9007199254740991m for cpu.
func MaxQuantity(res string) resource.Quantity {
	return *quantity(res, MaxAmount)
}

// Quantity renders an amount of a resource ("cpu", "memory", "storage";
// anything else is a count) as the API writes it: 1500m, 4Gi, 2.
func Quantity(res string, v int64) string {
	if res != "cpu" && res != "memory" && res != "storage" {
		return strconv.FormatInt(v, 10)
	}
	return quantity(res, v).String()
}

func quantity(res string, v int64) *resource.Quantity {
	switch res {
	case "cpu":
		return resource.NewMilliQuantity(v, resource.DecimalSI)
	case "memory", "storage":
		return resource.NewQuantity(v, resource.BinarySI)
	}
	return resource.NewQuantity(v, resource.DecimalSI)
}
