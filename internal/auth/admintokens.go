package auth

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"
)

var (
	// ErrNoCredentials is returned when a request carries no bearer token:
	// no Authorization header, or one with another scheme. Listeners map it
	// to 401.
	ErrNoCredentials = errors.New("no bearer token")
	// ErrBadCredentials is returned for a bearer token that is not valid:
	// an admin token that is not known, or a JWT that fails verification
	// (the wrapping error says why). Listeners map it to 401.
	ErrBadCredentials = errors.New("invalid bearer token")
	// ErrForbidden is returned when a known admin token's role is too low
	// for the operation, or when a valid JWT's org or team does not match
	// the employee record (see Identify). Listeners map it to 403.
	ErrForbidden = errors.New("forbidden")
)

// Role is what an admin token may do. Roles are ordered: a higher role may do
// everything a lower one may.
type Role int

// Roles, lowest first. The zero Role is no role at all, so a Token that was
// never set up cannot authorize anything.
const (
	RoleRead  Role = iota + 1 // read policies, employees, events and cluster state
	RoleAdmin                 // also write them and change membership
)

// String returns the role as written in the tokens file.
func (r Role) String() string {
	switch r {
	case RoleRead:
		return "read"
	case RoleAdmin:
		return "admin"
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

// ParseRole parses a role as written in the tokens file: "read" or "admin".
func ParseRole(s string) (Role, error) {
	switch s {
	case "read":
		return RoleRead, nil
	case "admin":
		return RoleAdmin, nil
	}
	return 0, fmt.Errorf("unknown role %q (want read or admin)", s)
}

// Token is one admin API credential, as known after authentication. Name is
// for logs and audit; the secret itself is never kept in a Token.
type Token struct {
	Name string
	Role Role
}

// minTokenLen keeps guessable tokens out of the file. 16 characters of
// base64 or hex are 64 to 96 bits, out of reach of online guessing.
const minTokenLen = 16

// AdminTokens is the set of bearer tokens accepted by the admin API. It is
// read-only after loading, so it is safe for concurrent use. A nil
// *AdminTokens means admin auth is off.
type AdminTokens struct {
	entries []tokenEntry
}

// tokenEntry keeps a SHA-256 digest rather than the token: digests have a
// fixed length, so comparing them in constant time does not leak a token's
// length, and the secret is not kept in memory.
type tokenEntry struct {
	digest [sha256.Size]byte
	token  Token
}

// LoadAdminTokens reads an admin tokens file. Each line is
//
//	<role> <token> [name]
//
// where role is "read" or "admin", token is at least 16 characters without
// spaces, and name (default "<file>:<line>") identifies the token in logs.
// Blank lines and lines starting with '#' are ignored. A '#' elsewhere is
// part of a field, since tokens may contain it.
//
// Errors name the file and line, never the token. A file with no tokens is an
// error: it would lock every client out, which is never what was meant.
func LoadAdminTokens(path string) (*AdminTokens, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load admin tokens: %w", err)
	}
	t, err := parseAdminTokens(path, data)
	if err != nil {
		return nil, fmt.Errorf("load admin tokens: %w", err)
	}
	return t, nil
}

func parseAdminTokens(path string, data []byte) (*AdminTokens, error) {
	t := &AdminTokens{}
	firstLine := make(map[[sha256.Size]byte]int)
	sc := bufio.NewScanner(bytes.NewReader(data))
	// A line holds at most a role, a token and a name; allowing 1 MiB only
	// keeps a pasted blob from failing with an obscure "token too long".
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		switch {
		case len(fields) < 2:
			return nil, fmt.Errorf("%s:%d: missing token: want \"<role> <token> [name]\"", path, n)
		case len(fields) > 3:
			return nil, fmt.Errorf("%s:%d: too many fields: want \"<role> <token> [name]\", got %d", path, n, len(fields))
		}
		role, err := ParseRole(fields[0])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if len(fields[1]) < minTokenLen {
			return nil, fmt.Errorf("%s:%d: token shorter than %d characters", path, n, minTokenLen)
		}
		digest := sha256.Sum256([]byte(fields[1]))
		if first, dup := firstLine[digest]; dup {
			return nil, fmt.Errorf("%s:%d: duplicate token (first on line %d)", path, n, first)
		}
		firstLine[digest] = n
		name := fmt.Sprintf("%s:%d", path, n)
		if len(fields) == 3 {
			name = fields[2]
			if err := checkTokenName(name); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, n, err)
			}
		}
		t.entries = append(t.entries, tokenEntry{digest: digest, token: Token{Name: name, Role: role}})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(t.entries) == 0 {
		return nil, fmt.Errorf("%s: no tokens", path)
	}
	return t, nil
}

// Authorize checks an Authorization header value ("Bearer <token>") for an
// operation that needs role need, and returns the token's identity.
//
// It returns ErrNoCredentials, ErrBadCredentials or ErrForbidden (wrapped,
// with context); with ErrForbidden it also returns the token, so that the
// refusal can be logged against it. A nil receiver means auth is off: every
// caller is Token{Name: "anonymous", Role: RoleAdmin}.
func (t *AdminTokens) Authorize(header string, need Role) (Token, error) {
	if t == nil {
		return Token{Name: "anonymous", Role: RoleAdmin}, nil
	}
	secret, err := BearerToken(header)
	if err != nil {
		return Token{}, err
	}

	// Compare against every entry, and select the match without a branch,
	// so that the time taken says nothing about which entry matched or how
	// close a guess came.
	digest := sha256.Sum256([]byte(secret))
	match := -1
	for i := range t.entries {
		eq := subtle.ConstantTimeCompare(digest[:], t.entries[i].digest[:])
		match = subtle.ConstantTimeSelect(eq, i, match)
	}
	if match < 0 {
		return Token{}, ErrBadCredentials
	}
	tok := t.entries[match].token
	return tok, tok.Allows(need)
}

// Allows is nil when the token's role suffices for need, else ErrForbidden
// (wrapped, naming both roles).
func (t Token) Allows(need Role) error {
	if t.Role < need {
		return fmt.Errorf("token %q has role %s, operation needs %s: %w", t.Name, t.Role, need, ErrForbidden)
	}
	return nil
}

// checkTokenName refuses a token name that is not valid UTF-8 or holds
// control characters: the name is the actor every event of the token's
// writes records, shown to operators in listings and terminals.
func checkTokenName(name string) error {
	if !utf8.ValidString(name) {
		return fmt.Errorf("token name %q is not valid UTF-8", name)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return fmt.Errorf("token name %q holds control character %U", name, r)
		}
	}
	return nil
}
