package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/sandboxd/sandboxd/tools"
)

var cmdTools = &command{
	name:    "tools",
	args:    "[--json] [session flags of mcp, --profile, --mode, --commands, --driver, --exec-timeout]",
	summary: "print the tool catalogue a session with these settings gets",
	setup: func(fs *flag.FlagSet) runFunc {
		asJSON := fs.Bool("json", false, `print JSON: {"tools":[{"name","skill","active","description","inputSchema","outputSchema"}],"skills":[…]}`)
		return withSession(fs, func(_ context.Context, sio stdio, s *session) error {
			if !*asJSON {
				return printCatalogue(sio, s.set)
			}
			enc := json.NewEncoder(sio.out)
			enc.SetIndent("", "  ")
			return enc.Encode(s.set.Catalogue())
		})
	},
}

func printCatalogue(sio stdio, set *tools.Set) error {
	tw := tabwriter.NewWriter(sio.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tSKILL\tACTIVE")
	for _, t := range set.List() {
		skill := t.Skill
		if skill == "" {
			skill = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\n", t.Name, skill, t.Active)
	}
	if e := set.WorkspaceShell(); e != nil {
		fmt.Fprintf(tw, "\nworkspaceShell (%s mode)\t%s\n", e.Mode, strings.Join(slices.Concat(e.Commands, e.Exec), " "))
	}
	fmt.Fprintln(tw, "\nSKILL\tGRANT\tGRANTED\tACTIVE")
	for _, sk := range set.Skills() {
		grant := sk.Grant
		if grant == "" {
			grant = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%v\n", sk.Name, grant, sk.Granted, sk.Active)
	}
	return tw.Flush()
}
