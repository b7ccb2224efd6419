package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/yaml"
)

const (
	outputTable    = ""
	outputWide     = "wide"
	outputName     = "name"
	outputJSON     = "json"
	outputYAML     = "yaml"
	outputJSONPath = "jsonpath="
)

// printFlags are kubectl's -o and --no-headers.
type printFlags struct {
	output    string
	noHeaders bool
}

func (p *printFlags) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&p.output, "output", "o", "", "output format: wide, name, json, yaml or jsonpath=<template> (default: a table)")
	cmd.Flags().BoolVar(&p.noHeaders, "no-headers", false, "print tables without their header row")
}

func (p *printFlags) validate() error {
	switch {
	case p.output == outputTable, p.output == outputWide, p.output == outputName, p.output == outputJSON, p.output == outputYAML:
		return nil
	case strings.HasPrefix(p.output, outputJSONPath):
		if strings.TrimPrefix(p.output, outputJSONPath) == "" {
			return fmt.Errorf("--output %q: jsonpath= needs a template, e.g. jsonpath='{.items[*].clusterID}'", p.output)
		}
		return nil
	}
	return fmt.Errorf("--output %q: must be wide, name, json, yaml or jsonpath=<template>", p.output)
}

// listing is what a get prints: a table (its wide columns have priority 1),
// the kind/name of each item, and the items as the broker's API gives them.
type listing struct {
	kind  string // singular, lower case: the name printer's prefix
	table *metav1.Table
	names []string
	items []any
	// single: one item was asked for by name; json/yaml print it alone,
	// not in a List.
	single bool
}

// print writes l in the format of p.
func (p *printFlags) print(out, errOut io.Writer, l listing) error {
	switch {
	case p.output == outputTable || p.output == outputWide:
		if len(l.names) == 0 {
			_, err := fmt.Fprintf(errOut, "No %ss found.\n", l.kind)
			return err
		}
		return printers.NewTablePrinter(printers.PrintOptions{NoHeaders: p.noHeaders, Wide: p.output == outputWide}).PrintObj(l.table, out)
	case p.output == outputName:
		for _, n := range l.names {
			if _, err := fmt.Fprintf(out, "%s/%s\n", l.kind, n); err != nil {
				return err
			}
		}
		return nil
	}
	doc, err := l.document()
	if err != nil {
		return err
	}
	switch p.output {
	case outputJSON:
		data, err := json.MarshalIndent(doc, "", "    ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", data)
		return err
	case outputYAML:
		data, err := yaml.Marshal(doc)
		if err != nil {
			return err
		}
		_, err = out.Write(data)
		return err
	}
	jp, err := printers.NewJSONPathPrinter(strings.TrimPrefix(p.output, outputJSONPath))
	if err != nil {
		return fmt.Errorf("--output %q: %w", p.output, err)
	}
	jp.AllowMissingKeys(true) // as kubectl: an absent field prints nothing
	return jp.PrintObj(&unstructured.Unstructured{Object: doc}, out)
}

// document is the JSON shape of l: its one item, or a List of its items as
// kubectl prints a list.
func (l listing) document() (map[string]any, error) {
	var v any = map[string]any{"apiVersion": "v1", "kind": "List", "items": l.items}
	if l.single && len(l.items) == 1 {
		v = l.items[0]
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	doc := map[string]any{}
	return doc, json.Unmarshal(data, &doc)
}

// columns makes a table's column definitions; a name ending in "+" is a
// wide column (-o wide).
func columns(names ...string) []metav1.TableColumnDefinition {
	defs := make([]metav1.TableColumnDefinition, len(names))
	for i, n := range names {
		defs[i] = metav1.TableColumnDefinition{Name: strings.TrimSuffix(n, "+"), Type: "string"}
		if strings.HasSuffix(n, "+") {
			defs[i].Priority = 1
		}
	}
	return defs
}

func tableRow(cells ...string) metav1.TableRow {
	r := metav1.TableRow{Cells: make([]any, len(cells))}
	for i, c := range cells {
		r.Cells[i] = c
	}
	return r
}
