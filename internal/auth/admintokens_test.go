package auth

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	readSecret  = "read-secret-0123456789"
	adminSecret = "admin-secret-0123456789"
)

// writeTokens writes content to a tokens file in a fresh temp dir.
func writeTokens(t testing.TB, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRole(t *testing.T) {
	if RoleRead >= RoleAdmin {
		t.Fatal("RoleRead must be lower than RoleAdmin")
	}
	tests := []struct {
		in      string
		want    Role
		wantErr bool
	}{
		{in: "read", want: RoleRead},
		{in: "admin", want: RoleAdmin},
		{in: "Admin", wantErr: true},
		{in: "write", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseRole(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseRole(%q) error = %v, wantErr %v", tc.in, err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if got != tc.want {
				t.Fatalf("ParseRole(%q) = %v, want %v", tc.in, got, tc.want)
			}
			if got, want := got.String(), tc.in; got != want {
				t.Fatalf("String() = %q, want %q", got, want)
			}
		})
	}
	if got, want := Role(0).String(), "Role(0)"; got != want {
		t.Fatalf("Role(0).String() = %q, want %q", got, want)
	}
}

func TestLoadAdminTokens(t *testing.T) {
	path := writeTokens(t, strings.Join([]string{
		"# admin tokens for the test cluster",
		"",
		"read " + readSecret + " dashboard",
		"   # indented comment",
		"\tadmin\t" + adminSecret + "  ",
		"admin has#hash-0123456789 ci\r",
	}, "\n"))
	tokens, err := LoadAdminTokens(path)
	if err != nil {
		t.Fatalf("LoadAdminTokens: %v", err)
	}
	tests := []struct {
		secret string
		want   Token
	}{
		{secret: readSecret, want: Token{Name: "dashboard", Role: RoleRead}},
		{secret: adminSecret, want: Token{Name: path + ":5", Role: RoleAdmin}},
		{secret: "has#hash-0123456789", want: Token{Name: "ci", Role: RoleAdmin}},
	}
	for _, tc := range tests {
		t.Run(tc.want.Name, func(t *testing.T) {
			got, err := tokens.Authorize("Bearer "+tc.secret, RoleRead)
			if err != nil {
				t.Fatalf("Authorize: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("token mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadAdminTokensErrors(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    string // substring of the error, after the file name
	}{
		{name: "unknown role", content: "write " + adminSecret, want: `:1: unknown role "write"`},
		{name: "missing token", content: "# c\nadmin", want: ":2: missing token"},
		{name: "short token", content: "admin short-token", want: ":1: token shorter than 16 characters"},
		{name: "duplicate token", content: "admin " + adminSecret + " a\n\nread " + adminSecret + " b", want: ":3: duplicate token (first on line 1)"},
		{name: "too many fields", content: "admin " + adminSecret + " ci # comment", want: ":1: too many fields"},
		{name: "empty file", content: "", want: ": no tokens"},
		{name: "only comments", content: "# nothing\n\n", want: ": no tokens"},
		{name: "line too long", content: "admin " + strings.Repeat("x", 2<<20), want: "too long"},
		{name: "name with a control character", content: "admin " + adminSecret + " ops\x1b[2J", want: `:1: token name "ops\x1b[2J" holds control character U+001B`},
		{name: "name with a DEL", content: "read " + adminSecret + " ci\x7f", want: ":1: token name"},
		{name: "name not UTF-8", content: "admin " + adminSecret + " op\xffs", want: `:1: token name "op\xffs" is not valid UTF-8`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeTokens(t, tc.content)
			_, err := LoadAdminTokens(path)
			if err == nil {
				t.Fatal("LoadAdminTokens succeeded, want error")
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %q, want it to name %q and contain %q", err, path, tc.want)
			}
			if strings.Contains(err.Error(), adminSecret) {
				t.Fatalf("error %q leaks the token", err)
			}
		})
	}

	t.Run("missing file", func(t *testing.T) {
		_, err := LoadAdminTokens(filepath.Join(t.TempDir(), "nope"))
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("error = %v, want os.ErrNotExist", err)
		}
	})
}

func TestAuthorize(t *testing.T) {
	tokens, err := LoadAdminTokens(writeTokens(t, "read "+readSecret+" reader\nadmin "+adminSecret+" root\n"))
	if err != nil {
		t.Fatal(err)
	}
	reader := Token{Name: "reader", Role: RoleRead}
	root := Token{Name: "root", Role: RoleAdmin}
	tests := []struct {
		name    string
		tokens  *AdminTokens
		header  string
		need    Role
		want    Token
		wantErr error
	}{
		{name: "no header", tokens: tokens, header: "", need: RoleRead, wantErr: ErrNoCredentials},
		{name: "basic scheme", tokens: tokens, header: "Basic x", need: RoleRead, wantErr: ErrNoCredentials},
		{name: "bearer without token", tokens: tokens, header: "Bearer ", need: RoleRead, wantErr: ErrNoCredentials},
		{name: "bare token", tokens: tokens, header: adminSecret, need: RoleRead, wantErr: ErrNoCredentials},
		{name: "unknown token", tokens: tokens, header: "Bearer not-a-known-token-at-all", need: RoleRead, wantErr: ErrBadCredentials},
		{name: "token prefix", tokens: tokens, header: "Bearer " + adminSecret[:len(adminSecret)-1], need: RoleRead, wantErr: ErrBadCredentials},
		{name: "read token on read op", tokens: tokens, header: "Bearer " + readSecret, need: RoleRead, want: reader},
		{name: "read token on admin op", tokens: tokens, header: "Bearer " + readSecret, need: RoleAdmin, want: reader, wantErr: ErrForbidden},
		{name: "admin token on read op", tokens: tokens, header: "Bearer " + adminSecret, need: RoleRead, want: root},
		{name: "admin token on admin op", tokens: tokens, header: "Bearer " + adminSecret, need: RoleAdmin, want: root},
		{name: "scheme is case-insensitive", tokens: tokens, header: "bearer " + adminSecret, need: RoleAdmin, want: root},
		{name: "extra spaces", tokens: tokens, header: "  Bearer   " + adminSecret + " ", need: RoleAdmin, want: root},
		{name: "nil means auth off", tokens: nil, header: "", need: RoleAdmin, want: Token{Name: "anonymous", Role: RoleAdmin}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.tokens.Authorize(tc.header, tc.need)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("Authorize error = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("token mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// FuzzLoadAdminTokens checks that no file content makes loading panic, and
// that every loaded token authorizes as itself. Run longer with:
//
//	go test ./internal/auth/ -run '^$' -fuzz '^FuzzLoadAdminTokens$' -fuzztime 60s
func FuzzLoadAdminTokens(f *testing.F) {
	f.Add("read " + readSecret + " dashboard\nadmin " + adminSecret + "\n")
	f.Add("# comment\n\n\tadmin\t" + adminSecret + "\r\n")
	f.Add("write " + adminSecret)
	f.Add("admin short")
	f.Add("admin " + adminSecret + "\nread " + adminSecret)
	f.Add("admin a b c d")
	f.Add("")
	f.Add("\x00\xff admin")
	f.Fuzz(func(t *testing.T, content string) {
		tokens, err := LoadAdminTokens(writeTokens(t, content))
		if err != nil {
			return
		}
		if len(tokens.entries) == 0 {
			t.Fatal("loaded a token set with no tokens")
		}
		for _, line := range strings.Split(content, "\n") {
			fields := strings.Fields(line)
			if len(fields) < 2 || strings.HasPrefix(fields[0], "#") {
				continue
			}
			if _, err := tokens.Authorize("Bearer "+fields[1], RoleRead); err != nil {
				t.Fatalf("token from line %q does not authorize: %v", line, err)
			}
		}
	})
}
