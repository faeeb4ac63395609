package server

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
)

// jwtSecret is the HS256 secret of the JWT-mode tests.
const jwtSecret = "test-secret-of-at-least-thirty-two-bytes!"

// jwtMode configures a node for auth.mode jwt with an HS256 secret file.
func jwtMode(t *testing.T) func(*config.Config) {
	dir := t.TempDir()
	path := filepath.Join(dir, "jwt.secret")
	if err := os.WriteFile(path, []byte(jwtSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	return func(cfg *config.Config) {
		cfg.Auth.Mode = "jwt"
		cfg.Auth.JWT.HMACSecretFile = path
		cfg.Auth.JWT.Issuer = "policyd-test"
		cfg.Auth.JWT.Leeway = time.Second
	}
}

// signJWT signs claims for employee sub with the test secret; exp is
// relative to now.
func signJWT(t *testing.T, sub, org, team string, exp time.Duration, mutate ...func(jwt.MapClaims)) string {
	t.Helper()
	claims := jwt.MapClaims{"sub": sub, "org": org, "team": team, "iss": "policyd-test", "exp": time.Now().Add(exp).Unix()}
	for _, f := range mutate {
		f(claims)
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(jwtSecret))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func bearer(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// TestDiscoveryJWT: with auth.mode jwt the scope comes from the token and
// the employee record, and every bad credential is refused.
func TestDiscoveryJWT(t *testing.T) {
	n, a := singleNode(t, jwtMode(t))
	a.put("/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"sec","status":"active"}`))
	a.put("/v1/employees/idle", []byte(`{"id":"idle","org":"acme","team":"sec","status":"inactive"}`))
	a.put("/v1/policies/acme.a", scopedPolicy("acme.a", policy.Scope{Org: "acme"}, "a"))
	a.put("/v1/policies/beta.a", scopedPolicy("beta.a", policy.Scope{Org: "beta"}, "a"))
	cc := dialGRPC(t, n.GRPCAddr())
	alice := policy.Scope{Org: "acme", Team: "sec", Employee: "alice"}

	refused := []struct {
		name  string
		ctx   context.Context
		scope policy.Scope
		code  codes.Code
	}{
		{"no token", context.Background(), alice, codes.Unauthenticated},
		{"garbage token", bearer(context.Background(), "not.a.jwt"), alice, codes.Unauthenticated},
		{"expired token", bearer(context.Background(), signJWT(t, "alice", "acme", "sec", -time.Minute)), alice, codes.Unauthenticated},
		{"wrong issuer", bearer(context.Background(), signJWT(t, "alice", "acme", "sec", time.Hour, func(c jwt.MapClaims) { c["iss"] = "evil" })), alice, codes.Unauthenticated},
		{"unknown employee", bearer(context.Background(), signJWT(t, "mallory", "acme", "sec", time.Hour)), policy.Scope{}, codes.Unauthenticated},
		{"inactive employee", bearer(context.Background(), signJWT(t, "idle", "acme", "sec", time.Hour)), policy.Scope{}, codes.PermissionDenied},
		{"token for another org", bearer(context.Background(), signJWT(t, "alice", "beta", "", time.Hour)), policy.Scope{}, codes.PermissionDenied},
		{"scope mismatch", bearer(context.Background(), signJWT(t, "alice", "acme", "sec", time.Hour)), policy.Scope{Org: "beta"}, codes.PermissionDenied},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			s := openStream(t, cc, "c-"+tc.name, tc.scope, withCtx(tc.ctx))
			if st := s.end(); st.Code() != tc.code {
				t.Fatalf("stream ended with %v, want %v", st, tc.code)
			}
		})
	}

	token := signJWT(t, "alice", "acme", "sec", time.Hour)
	for _, scope := range []policy.Scope{{}, alice} {
		s := openStream(t, cc, "c-alice", scope, withCtx(bearer(context.Background(), token)))
		if r := s.next(); !slices.Equal(names(r), []string{"acme.a"}) {
			t.Fatalf("alice (asking for %q) got %v, want only her org's policy", scope, names(r))
		}
	}

	t.Run("deactivating the employee ends her streams", func(t *testing.T) {
		s := openStream(t, cc, "c-revoked", alice, withCtx(bearer(context.Background(), token)))
		s.ack(s.next())
		if r := a.do(http.MethodPut, "/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"sec","status":"inactive"}`), nil); r.status != http.StatusOK {
			t.Fatalf("deactivate: %d %s", r.status, r.body)
		}
		if st := s.end(); st.Code() != codes.PermissionDenied {
			t.Fatalf("stream of a deactivated employee ended with %v, want PermissionDenied", st)
		}
		again := openStream(t, cc, "c-revoked-again", alice, withCtx(bearer(context.Background(), token)))
		if st := again.end(); st.Code() != codes.PermissionDenied {
			t.Fatalf("reconnect after deactivation ended with %v, want PermissionDenied", st)
		}
	})
}
