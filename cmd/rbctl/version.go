package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/internal/rbctl/output"
	"github.com/fluidos-project/resource-broker/internal/version"
)

func newVersionCommand() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print rbctl's version",
		Long: `version prints the version rbctl was built as (stamped at build time with
-ldflags, see internal/version), its commit, Go version and platform.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := version.Get()
			switch format {
			case "":
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "rbctl %s\n", v.String())
				return err
			case output.JSON, output.YAML:
				p := output.Flags{Output: format}
				return p.Print(cmd.OutOrStdout(), cmd.ErrOrStderr(), output.Listing{Single: true, Items: []any{map[string]any{"clientVersion": v}}})
			}
			return fmt.Errorf("--output %q: must be json or yaml", format)
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "", "json or yaml (default: one line)")
	return cmd
}
