package cli

import (
	"fmt"
	"io"
	"net/url"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/internal/buildinfo"
)

// versionReport is what version prints with -o json/yaml.
type versionReport struct {
	Client  adminclient.VersionInfo     `json:"client"`
	Servers []adminclient.ServerVersion `json:"servers,omitempty"`
}

// clientVersion is this binary's build, as a server reports its own.
func clientVersion() adminclient.VersionInfo {
	b := buildinfo.Read()
	return adminclient.VersionInfo{Version: b.Version, GoVersion: b.GoVersion, Commit: b.Commit}
}

func versionCommand(c *adminClient) *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the client's version and every cluster member's",
		Long: `version prints this binary's version, then each cluster member's (GET
/v1/version on every member --server lists in its cluster status). A member
that does not answer is shown with its error, and the exit code is 1.
--client prints the client's alone and needs no server.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(c.output); err != nil {
				return err
			}
			rep := versionReport{Client: clientVersion()}
			var failed error
			if !clientOnly {
				servers, err := serverVersions(cmd, c)
				if err != nil {
					failed = err
				}
				rep.Servers = servers
			}
			err := c.print(cmd, rep, func(w io.Writer) error {
				fmt.Fprintf(w, "policyd %s (%s, commit %s)\n", rep.Client.Version, rep.Client.GoVersion, rep.Client.Commit)
				for _, s := range rep.Servers {
					if s.Error != "" {
						fmt.Fprintf(w, "server %s: %s\n", s.Server, s.Error)
						continue
					}
					fmt.Fprintf(w, "server %s: %s (%s, commit %s)\n", s.Server, s.Build.Version, s.Build.GoVersion, s.Build.Commit)
				}
				return nil
			})
			if err != nil {
				return err
			}
			return failed
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "print only the client's version")
	return cmd
}

// serverVersions asks every member of the cluster for its version.
func serverVersions(cmd *cobra.Command, c *adminClient) ([]adminclient.ServerVersion, error) {
	api, err := c.client()
	if err != nil {
		return nil, err
	}
	st, err := api.Cluster(cmd.Context())
	if err != nil {
		return nil, err
	}
	scheme := "http"
	if u, err := url.Parse(api.Servers()[0]); err == nil {
		scheme = u.Scheme
	}
	var out []adminclient.ServerVersion
	var failed int
	for _, m := range st.Members {
		sv := adminclient.ServerVersion{Server: m.ID}
		if m.HTTPAddr == "" {
			sv.Error = "has not registered its HTTP address"
			failed++
		} else if b, err := api.VersionOf(cmd.Context(), scheme+"://"+m.HTTPAddr); err != nil {
			sv.Error = err.Error()
			failed++
		} else {
			sv.Build = b
		}
		out = append(out, sv)
	}
	if failed > 0 {
		return out, fmt.Errorf("%d of %d members did not report a version", failed, len(st.Members))
	}
	return out, nil
}
