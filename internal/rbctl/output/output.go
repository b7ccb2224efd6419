// Package output is how rbctl prints what it lists, the kubectl way: a
// Listing (a table whose wide columns have priority 1, the kind/name of each
// item, and the items as the broker's API gives them) in the format of -o
// and --no-headers, and how quantities, prices and times read in its cells.
package output

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/yaml"
)

// The values of -o.
const (
	Table    = ""
	Wide     = "wide"
	Name     = "name"
	JSON     = "json"
	YAML     = "yaml"
	JSONPath = "jsonpath="
)

// Flags are kubectl's -o and --no-headers.
type Flags struct {
	Output    string
	NoHeaders bool
}

// AddFlags registers -o and --no-headers.
func (f *Flags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVarP(&f.Output, "output", "o", "", "output format: wide, name, json, yaml or jsonpath=<template> (default: a table)")
	fs.BoolVar(&f.NoHeaders, "no-headers", false, "print tables without their header row")
}

// Validate checks -o before anything is asked of the broker.
func (f *Flags) Validate() error {
	switch {
	case f.Output == Table, f.Output == Wide, f.Output == Name, f.Output == JSON, f.Output == YAML:
		return nil
	case strings.HasPrefix(f.Output, JSONPath):
		if strings.TrimPrefix(f.Output, JSONPath) == "" {
			return fmt.Errorf("--output %q: jsonpath= needs a template, e.g. jsonpath='{.items[*].clusterID}'", f.Output)
		}
		return nil
	}
	return fmt.Errorf("--output %q: must be wide, name, json, yaml or jsonpath=<template>", f.Output)
}

// Listing is what a get prints: a table (its wide columns have priority 1),
// the kind/name of each item, and the items as the broker's API gives them.
type Listing struct {
	Kind  string // singular, lower case: the name printer's prefix
	Table *metav1.Table
	Names []string
	Items []any
	// Single: one item was asked for by name; json/yaml print it alone,
	// not in a List.
	Single bool
}

// Print writes l in the format of f.
func (f *Flags) Print(out, errOut io.Writer, l Listing) error {
	switch {
	case f.Output == Table || f.Output == Wide:
		if len(l.Names) == 0 {
			_, err := fmt.Fprintf(errOut, "No %ss found.\n", l.Kind)
			return err
		}
		return printers.NewTablePrinter(printers.PrintOptions{NoHeaders: f.NoHeaders, Wide: f.Output == Wide}).PrintObj(l.Table, out)
	case f.Output == Name:
		for _, n := range l.Names {
			if _, err := fmt.Fprintf(out, "%s/%s\n", l.Kind, n); err != nil {
				return err
			}
		}
		return nil
	}
	doc, err := l.document()
	if err != nil {
		return err
	}
	switch f.Output {
	case JSON:
		data, err := json.MarshalIndent(doc, "", "    ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", data)
		return err
	case YAML:
		data, err := yaml.Marshal(doc)
		if err != nil {
			return err
		}
		_, err = out.Write(data)
		return err
	}
	jp, err := printers.NewJSONPathPrinter(strings.TrimPrefix(f.Output, JSONPath))
	if err != nil {
		return fmt.Errorf("--output %q: %w", f.Output, err)
	}
	jp.AllowMissingKeys(true) // as kubectl: an absent field prints nothing
	return jp.PrintObj(&unstructured.Unstructured{Object: doc}, out)
}

// document is the JSON shape of l: its one item, or a List of its items as
// kubectl prints a list.
func (l Listing) document() (map[string]any, error) {
	var v any = map[string]any{"apiVersion": "v1", "kind": "List", "items": l.Items}
	if l.Single && len(l.Items) == 1 {
		v = l.Items[0]
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	doc := map[string]any{}
	return doc, json.Unmarshal(data, &doc)
}

// Columns makes a table's column definitions; a name ending in "+" is a
// wide column (-o wide).
func Columns(names ...string) []metav1.TableColumnDefinition {
	defs := make([]metav1.TableColumnDefinition, len(names))
	for i, n := range names {
		defs[i] = metav1.TableColumnDefinition{Name: strings.TrimSuffix(n, "+"), Type: "string"}
		if strings.HasSuffix(n, "+") {
			defs[i].Priority = 1
		}
	}
	return defs
}

// Row is a table row of cells.
func Row(cells ...string) metav1.TableRow {
	r := metav1.TableRow{Cells: make([]any, len(cells))}
	for i, c := range cells {
		r.Cells[i] = c
	}
	return r
}
