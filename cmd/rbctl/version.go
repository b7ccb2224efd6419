package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/internal/version"
)

func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print rbctl's version",
		Long: `version prints the version rbctl was built as (stamped at build time with
-ldflags, see internal/version), its commit, Go version and platform.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := version.Get()
			switch output {
			case "":
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "rbctl %s\n", v.String())
				return err
			case outputJSON, outputYAML:
				p := printFlags{output: output}
				return p.print(cmd.OutOrStdout(), cmd.ErrOrStderr(), listing{single: true, items: []any{map[string]any{"clientVersion": v}}})
			}
			return fmt.Errorf("--output %q: must be json or yaml", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json or yaml (default: one line)")
	return cmd
}
