package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// timeline prints each pod's steps once, with the time since the pod was created.
type timeline struct {
	bed        *testbed.Bed
	podSeen    map[string]time.Time
	podOf      map[string]string // reservation -> pod
	done       map[string]bool   // "<kind>/<name>/<step>" printed
	running    map[string]string // pod -> provider
	firstPod   time.Time
	nodeNeeded map[string]bool
}

func newTimeline(bed *testbed.Bed) *timeline {
	return &timeline{bed: bed, podSeen: map[string]time.Time{}, podOf: map[string]string{},
		done: map[string]bool{}, running: map[string]string{}, nodeNeeded: map[string]bool{}}
}

func (tl *timeline) once(key string) bool {
	if tl.done[key] {
		return false
	}
	tl.done[key] = true
	return true
}

func (tl *timeline) since(pod string) string {
	t, ok := tl.podSeen[pod]
	if !ok {
		return ""
	}
	return fmt.Sprintf("+%dms", time.Since(t).Milliseconds())
}

func (tl *timeline) line(pod, format string, args ...any) {
	say("%-9s %-24s %s", tl.since(pod), pod, fmt.Sprintf(format, args...))
}

func (tl *timeline) handle(ctx context.Context, ev watch.Event) {
	switch o := ev.Object.(type) {
	case *corev1.Pod:
		if ev.Type == watch.Deleted {
			return
		}
		if _, ok := tl.podSeen[o.Name]; !ok {
			tl.podSeen[o.Name] = time.Now()
			if tl.firstPod.IsZero() {
				tl.firstPod = time.Now()
			}
			tl.line(o.Name, "pod created in rome (scheduler %s)", o.Spec.SchedulerName)
		}
		if o.Spec.NodeName != "" && tl.once("pod/"+o.Name+"/bound") {
			tl.line(o.Name, "pod bound to node %s", o.Spec.NodeName)
		}
		if o.Status.Phase == corev1.PodRunning && tl.once("pod/"+o.Name+"/running") {
			provider := strings.TrimPrefix(o.Spec.NodeName, "rb-")
			tl.running[o.Name] = provider
			tl.line(o.Name, "%s", bold(fmt.Sprintf("pod Running on %s (node %s)", provider, o.Spec.NodeName)))
		}
	case *rbv1.Reservation:
		if ev.Type == watch.Deleted {
			return
		}
		pod := o.Spec.PodName
		tl.podOf[o.Name] = pod
		if tl.once("rsv/" + o.Name + "/opened") {
			tl.line(pod, "Reservation %s opened (cpu %s, memory %s)", o.Name,
				o.Spec.Resources.Cpu().String(), o.Spec.Resources.Memory().String())
		}
		if o.Status.Provider != "" && tl.once("rsv/"+o.Name+"/decided") {
			tl.nodeNeeded["rb-"+o.Status.Provider] = true
			tl.line(pod, "%s%s", bold(fmt.Sprintf("broker decided: %s, score %s", o.Status.Provider, o.Status.Score)),
				tl.candidates(ctx, o))
		}
		if o.Status.Phase == rbv1.ReservationActive && tl.once("rsv/"+o.Name+"/active") {
			vn := ""
			if o.Status.VirtualNode != "" {
				vn = ", virtual node " + o.Status.VirtualNode
			}
			tl.line(pod, "Reservation Active (%s granted it%s)", o.Status.Provider, vn)
		}
		if o.Status.Phase != "" && o.Status.Phase != rbv1.ReservationPending && !live(o.Status.Phase) &&
			tl.once("rsv/"+o.Name+"/phase/"+string(o.Status.Phase)) {
			tl.line(pod, "Reservation %s: %s %s", o.Status.Phase, o.Status.Reason, o.Status.Message)
		}
	case *corev1.Node:
		if !strings.HasPrefix(o.Name, "rb-") || ev.Type == watch.Deleted {
			return
		}
		if nodeReady(o) && tl.once("node/"+o.Name+"/ready") {
			since := ""
			if !tl.firstPod.IsZero() {
				since = fmt.Sprintf("+%dms", time.Since(tl.firstPod).Milliseconds())
			}
			say("%-9s %-24s virtual node %s Ready in rome (%s CPU, %s memory allocatable)", since, "",
				o.Name, o.Status.Allocatable.Cpu().String(), o.Status.Allocatable.Memory().String())
		}
	}
}

// candidates reads the decision's candidates from the broker's Redis (the
// Reservation's status carries the chosen provider's score only).
func (tl *timeline) candidates(ctx context.Context, r *rbv1.Reservation) string {
	id := r.Status.ReservationID
	if id == "" {
		id = string(r.UID)
	}
	rr, err := tl.bed.Store.Reservation(ctx, "rome", id) // rome is the demo's requester
	if err != nil || len(rr.Candidates) == 0 {
		return ""
	}
	var parts []string
	for _, c := range rr.Candidates {
		parts = append(parts, fmt.Sprintf("%s %s (resources %s, cost %s, %s/h)", c.Cluster, num(c.Score),
			num(c.ResourceScore), num(c.CostScore), tl.money(ctx, c.Cluster, c.Price)))
	}
	return "; candidates: " + strings.Join(parts, ", ")
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// money formats micro-units of cluster's currency.
func (tl *timeline) money(ctx context.Context, cluster string, micro int64) string {
	s := strconv.FormatFloat(float64(micro)/1e6, 'f', 3, 64)
	if c, err := tl.bed.Store.Cluster(ctx, cluster); err == nil && c.Prices.Currency != "" {
		s += " " + c.Prices.Currency
	}
	return s
}

func live(p rbv1.ReservationPhase) bool {
	return p == rbv1.ReservationReserved || p == rbv1.ReservationActive
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (tl *timeline) allRunning() bool { return len(tl.running) == replicas }

func (tl *timeline) summary() string {
	count := map[string]int{}
	for _, p := range tl.running {
		count[p]++
	}
	var parts []string
	for p, n := range count {
		parts = append(parts, fmt.Sprintf("%d on %s", n, p))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ") + fmt.Sprintf(" (%s after the first pod was created)",
		time.Since(tl.firstPod).Round(time.Millisecond))
}
