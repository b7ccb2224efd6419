package collector

import (
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Resources are the resources the collector measures, in the order of amounts.
var Resources = []corev1.ResourceName{
	corev1.ResourceCPU, corev1.ResourceMemory, rbv1.ResourceGPU, corev1.ResourceEphemeralStorage,
}

// amounts holds one value per measured resource in the broker's integer
// units: CPU in millicores, memory in bytes, GPUs as a count, ephemeral
// storage in bytes. Running totals are kept in this form so that an event
// costs a few additions, not map and quantity arithmetic.
type amounts [4]int64

const (
	idxCPU = iota
	idxMemory
	idxGPU
	idxStorage
)

// amountsOf converts the measured resources of l; other resources are ignored.
func amountsOf(l corev1.ResourceList) amounts {
	var a amounts
	if q, ok := l[corev1.ResourceCPU]; ok {
		a[idxCPU] = q.MilliValue()
	}
	if q, ok := l[corev1.ResourceMemory]; ok {
		a[idxMemory] = q.Value()
	}
	if q, ok := l[rbv1.ResourceGPU]; ok {
		a[idxGPU] = q.Value()
	}
	if q, ok := l[corev1.ResourceEphemeralStorage]; ok {
		a[idxStorage] = q.Value()
	}
	return a
}

func (a *amounts) add(b amounts) {
	for i := range a {
		a[i] += b[i]
	}
}

func (a *amounts) sub(b amounts) {
	for i := range a {
		a[i] -= b[i]
	}
}

// list renders the amounts as a ResourceList holding every measured resource.
func (a amounts) list() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewMilliQuantity(a[idxCPU], resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(a[idxMemory], resource.BinarySI),
		rbv1.ResourceGPU:                *resource.NewQuantity(a[idxGPU], resource.DecimalSI),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(a[idxStorage], resource.BinarySI),
	}
}
