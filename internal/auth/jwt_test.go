package auth

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Shared test keys. RSA key generation is slow, so each key is made once per
// test binary.
type testKeySet struct {
	rsaA, rsaB *rsa.PrivateKey
	ecA, ecB   *ecdsa.PrivateKey
	secret     []byte // HS256 secret, 48 bytes
	other      []byte // another HS256 secret
}

var testKeys = sync.OnceValue(func() testKeySet {
	mustRSA := func() *rsa.PrivateKey {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			panic(err)
		}
		return k
	}
	mustEC := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		return k
	}
	return testKeySet{
		rsaA:   mustRSA(),
		rsaB:   mustRSA(),
		ecA:    mustEC(),
		ecB:    mustEC(),
		secret: []byte(strings.Repeat("s3cret-", 7)[:48]),
		other:  []byte(strings.Repeat("other-", 8)),
	}
})

// t0 is the fake clock's start. Tokens are minted relative to it.
var t0 = time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: t0} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// syncBuffer is a log sink that is safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newTestLogger() (*slog.Logger, *syncBuffer) {
	buf := &syncBuffer{}
	return slog.New(slog.NewTextHandler(buf, nil)), buf
}

func writeFile(t testing.TB, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// rewrite replaces the content of path the way a deployment tool would:
// write a temp file and rename it over the old one.
func rewrite(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func pemPKIX(t testing.TB, pubs ...any) []byte {
	t.Helper()
	var out []byte
	for _, pub := range pubs {
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})...)
	}
	return out
}

// testJWK is one key for jwksJSON. extra members override the computed ones.
type testJWK struct {
	kid   string
	pub   any
	extra map[string]any
}

func jwkMap(t testing.TB, k testJWK) map[string]any {
	t.Helper()
	b64 := base64.RawURLEncoding.EncodeToString
	m := map[string]any{}
	if k.kid != "" {
		m["kid"] = k.kid
	}
	switch pub := k.pub.(type) {
	case *rsa.PublicKey:
		m["kty"] = "RSA"
		m["n"] = b64(pub.N.Bytes())
		m["e"] = b64(big.NewInt(int64(pub.E)).Bytes())
	case *ecdsa.PublicKey:
		raw, err := pub.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		size := (len(raw) - 1) / 2
		m["kty"] = "EC"
		m["crv"] = pub.Curve.Params().Name
		m["x"] = b64(raw[1 : 1+size])
		m["y"] = b64(raw[1+size:])
	case nil:
	default:
		t.Fatalf("jwkMap: unsupported key %T", pub)
	}
	for name, v := range k.extra {
		m[name] = v
	}
	return m
}

func jwksJSON(t testing.TB, keys ...testJWK) []byte {
	t.Helper()
	set := struct {
		Keys []map[string]any `json:"keys"`
	}{Keys: []map[string]any{}}
	for _, k := range keys {
		set.Keys = append(set.Keys, jwkMap(t, k))
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const (
	testIssuer   = "https://idp.example"
	testAudience = "policyd"
	testLeeway   = time.Minute
)

// claimsAt returns valid claims for a token minted at now.
func claimsAt(now time.Time) jwt.MapClaims {
	return jwt.MapClaims{
		"sub":  "e-1",
		"org":  "acme",
		"team": "eng",
		"iss":  testIssuer,
		"aud":  testAudience,
		"iat":  now.Unix(),
		"exp":  now.Add(time.Hour).Unix(),
	}
}

// with returns a copy of c with the given claims set; a nil value deletes.
func with(c jwt.MapClaims, kv ...any) jwt.MapClaims {
	out := jwt.MapClaims{}
	for k, v := range c {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		name := kv[i].(string)
		if kv[i+1] == nil {
			delete(out, name)
		} else {
			out[name] = kv[i+1]
		}
	}
	return out
}

// sign mints a token; header entries (kid, crit...) are set as given.
func sign(t testing.TB, method jwt.SigningMethod, key any, claims jwt.MapClaims, header map[string]any) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	for k, v := range header {
		tok.Header[k] = v
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatalf("sign %s: %v", method.Alg(), err)
	}
	return s
}

func kid(id string) map[string]any { return map[string]any{"kid": id} }

// tamper re-encodes token's payload with sub changed, keeping the signature.
func tamper(t testing.TB, token string) string {
	t.Helper()
	parts := strings.Split(token, ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(payload, &m); err != nil {
		t.Fatal(err)
	}
	m["sub"] = "e-admin"
	payload, err = json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	parts[1] = base64.RawURLEncoding.EncodeToString(payload)
	return strings.Join(parts, ".")
}

// unsigned builds a token with the given header and claims and an empty
// signature, as an attacker would by hand.
func unsigned(t testing.TB, header map[string]any, claims jwt.MapClaims) string {
	t.Helper()
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	c, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c) + "."
}

// baseConfig is the issuer, audience and leeway every test verifier checks.
func baseConfig() config.JWT {
	return config.JWT{Issuer: testIssuer, Audience: testAudience, Leeway: testLeeway}
}

// newTestVerifier builds a verifier on clock and closes it at the end.
func newTestVerifier(t testing.TB, cfg config.JWT, clock *fakeClock, logger *slog.Logger) *JWTVerifier {
	t.Helper()
	v, err := newJWTVerifier(cfg, logger, clock.Now)
	if err != nil {
		t.Fatalf("newJWTVerifier: %v", err)
	}
	t.Cleanup(func() {
		if err := v.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return v
}

func TestVerify(t *testing.T) {
	keys := testKeys()
	clock := newFakeClock()
	now := clock.Now()

	hmacCfg := baseConfig()
	// Surrounding whitespace is not part of the secret.
	hmacCfg.HMACSecretFile = writeFile(t, "secret", append(append([]byte("\n  "), keys.secret...), '\n'))
	hmacV := newTestVerifier(t, hmacCfg, clock, nil)

	rsaPEM := pemPKIX(t, &keys.rsaA.PublicKey)
	pemCfg := baseConfig()
	pemCfg.PublicKeysFile = writeFile(t, "keys.pem", append(append([]byte("# signing keys\n"), rsaPEM...), pemPKIX(t, &keys.ecA.PublicKey)...))
	pemV := newTestVerifier(t, pemCfg, clock, nil)

	jwksCfg := baseConfig()
	jwksCfg.JWKSFile = writeFile(t, "jwks.json", jwksJSON(t,
		testJWK{kid: "ra", pub: &keys.rsaA.PublicKey, extra: map[string]any{"use": "sig", "alg": "RS256"}},
		testJWK{kid: "ea", pub: &keys.ecA.PublicKey},
	))
	jwksV := newTestVerifier(t, jwksCfg, clock, nil)

	bothCfg := baseConfig()
	bothCfg.PublicKeysFile = writeFile(t, "keys.pem", rsaPEM)
	bothCfg.JWKSFile = writeFile(t, "jwks.json", jwksJSON(t,
		testJWK{kid: "rb", pub: &keys.rsaB.PublicKey},
		testJWK{kid: "eb", pub: &keys.ecB.PublicKey},
	))
	bothV := newTestVerifier(t, bothCfg, clock, nil)

	valid := claimsAt(now)
	wantClaims := Claims{Subject: "e-1", Org: "acme", Team: "eng", Expiry: now.Add(time.Hour)}
	hs := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodHS256, keys.secret, c, nil) }
	noneToken := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, valid, nil)

	tests := []struct {
		name   string
		v      *JWTVerifier
		token  string
		want   Claims
		wantOK bool
		is     error  // also wrapped, besides ErrBadCredentials
		msg    string // substring of the error
	}{
		// Valid tokens for every key source.
		{name: "HS256", v: hmacV, token: hs(valid), want: wantClaims, wantOK: true},
		{name: "HS256 with kid", v: hmacV, token: sign(t, jwt.SigningMethodHS256, keys.secret, valid, kid("k1")), want: wantClaims, wantOK: true},
		{name: "HS256 without team", v: hmacV, token: hs(with(valid, "team", nil)), want: Claims{Subject: "e-1", Org: "acme", Expiry: wantClaims.Expiry}, wantOK: true},
		{name: "HS256 aud list", v: hmacV, token: hs(with(valid, "aud", []string{"other", testAudience})), want: wantClaims, wantOK: true},
		{name: "PEM RS256", v: pemV, token: sign(t, jwt.SigningMethodRS256, keys.rsaA, valid, nil), want: wantClaims, wantOK: true},
		{name: "PEM RS256 with kid", v: pemV, token: sign(t, jwt.SigningMethodRS256, keys.rsaA, valid, kid("any")), want: wantClaims, wantOK: true},
		{name: "PEM ES256", v: pemV, token: sign(t, jwt.SigningMethodES256, keys.ecA, valid, nil), want: wantClaims, wantOK: true},
		{name: "JWKS RS256 with kid", v: jwksV, token: sign(t, jwt.SigningMethodRS256, keys.rsaA, valid, kid("ra")), want: wantClaims, wantOK: true},
		{name: "JWKS RS256 without kid", v: jwksV, token: sign(t, jwt.SigningMethodRS256, keys.rsaA, valid, nil), want: wantClaims, wantOK: true},
		{name: "JWKS ES256 with kid", v: jwksV, token: sign(t, jwt.SigningMethodES256, keys.ecA, valid, kid("ea")), want: wantClaims, wantOK: true},
		{name: "JWKS ES256 without kid", v: jwksV, token: sign(t, jwt.SigningMethodES256, keys.ecA, valid, nil), want: wantClaims, wantOK: true},
		{name: "both: JWKS key by kid", v: bothV, token: sign(t, jwt.SigningMethodES256, keys.ecB, valid, kid("eb")), want: wantClaims, wantOK: true},
		{name: "both: JWKS key without kid", v: bothV, token: sign(t, jwt.SigningMethodRS256, keys.rsaB, valid, nil), want: wantClaims, wantOK: true},
		{name: "both: PEM key without kid", v: bothV, token: sign(t, jwt.SigningMethodRS256, keys.rsaA, valid, nil), want: wantClaims, wantOK: true},
		{name: "both: PEM key with another key's kid", v: bothV, token: sign(t, jwt.SigningMethodRS256, keys.rsaA, valid, kid("rb")), want: wantClaims, wantOK: true},
		{name: "both: PEM key with unknown kid", v: bothV, token: sign(t, jwt.SigningMethodRS256, keys.rsaA, valid, kid("zz")), want: wantClaims, wantOK: true},

		// Time.
		{name: "expired", v: hmacV, token: hs(with(valid, "exp", now.Add(-2*testLeeway).Unix())), is: jwt.ErrTokenExpired, msg: "expired"},
		{name: "expired within leeway", v: hmacV, token: hs(with(valid, "exp", now.Add(-testLeeway/2).Unix())),
			want: Claims{Subject: "e-1", Org: "acme", Team: "eng", Expiry: now.Add(-testLeeway / 2)}, wantOK: true},
		{name: "nbf in the future", v: hmacV, token: hs(with(valid, "nbf", now.Add(2*testLeeway).Unix())), is: jwt.ErrTokenNotValidYet, msg: "not valid yet"},
		{name: "nbf within leeway", v: hmacV, token: hs(with(valid, "nbf", now.Add(testLeeway/2).Unix())), want: wantClaims, wantOK: true},
		{name: "iat in the future", v: hmacV, token: hs(with(valid, "iat", now.Add(2*testLeeway).Unix())), is: jwt.ErrTokenUsedBeforeIssued},
		{name: "missing exp", v: hmacV, token: hs(with(valid, "exp", nil)), is: jwt.ErrTokenRequiredClaimMissing, msg: "exp claim is required"},
		{name: "exp of wrong type", v: hmacV, token: hs(with(valid, "exp", "tomorrow")), is: jwt.ErrTokenMalformed},

		// Issuer and audience.
		{name: "wrong issuer", v: hmacV, token: hs(with(valid, "iss", "https://evil.example")), is: jwt.ErrTokenInvalidIssuer, msg: "issuer"},
		{name: "missing issuer", v: hmacV, token: hs(with(valid, "iss", nil)), is: jwt.ErrTokenRequiredClaimMissing, msg: "iss"},
		{name: "wrong audience", v: jwksV, token: sign(t, jwt.SigningMethodRS256, keys.rsaA, with(valid, "aud", "someone-else"), nil), is: jwt.ErrTokenInvalidAudience, msg: "audience"},
		{name: "missing audience", v: hmacV, token: hs(with(valid, "aud", nil)), is: jwt.ErrTokenRequiredClaimMissing, msg: "aud"},

		// Signatures and keys.
		{name: "HS256 tampered", v: hmacV, token: tamper(t, hs(valid)), is: jwt.ErrTokenSignatureInvalid},
		{name: "RS256 tampered", v: pemV, token: tamper(t, sign(t, jwt.SigningMethodRS256, keys.rsaA, valid, nil)), is: jwt.ErrTokenSignatureInvalid},
		{name: "ES256 tampered", v: jwksV, token: tamper(t, sign(t, jwt.SigningMethodES256, keys.ecA, valid, kid("ea"))), is: jwt.ErrTokenSignatureInvalid},
		{name: "HS256 other secret", v: hmacV, token: sign(t, jwt.SigningMethodHS256, keys.other, valid, nil), is: jwt.ErrTokenSignatureInvalid},
		{name: "PEM RS256 other key", v: pemV, token: sign(t, jwt.SigningMethodRS256, keys.rsaB, valid, nil), is: jwt.ErrTokenSignatureInvalid},
		{name: "PEM ES256 other key", v: pemV, token: sign(t, jwt.SigningMethodES256, keys.ecB, valid, nil), is: jwt.ErrTokenSignatureInvalid},
		{name: "JWKS ES256 other key with kid", v: jwksV, token: sign(t, jwt.SigningMethodES256, keys.ecB, valid, kid("ea")), is: jwt.ErrTokenSignatureInvalid},
		{name: "JWKS unknown kid", v: jwksV, token: sign(t, jwt.SigningMethodRS256, keys.rsaA, valid, kid("nope")), is: jwt.ErrTokenUnverifiable, msg: `no RS256 key with kid "nope"`},
		{name: "JWKS kid of a key of another type", v: jwksV, token: sign(t, jwt.SigningMethodRS256, keys.rsaA, valid, kid("ea")), is: jwt.ErrTokenUnverifiable, msg: `kid "ea"`},
		{name: "JWKS kid not a string", v: jwksV, token: sign(t, jwt.SigningMethodRS256, keys.rsaA, valid, map[string]any{"kid": 7}), is: jwt.ErrTokenUnverifiable, msg: "kid header is not a string"},
		{name: "both: other key with PEM fallback", v: bothV, token: sign(t, jwt.SigningMethodRS256, keys.rsaB, valid, kid("zz")), is: jwt.ErrTokenSignatureInvalid},
		{name: "crit header", v: hmacV, token: sign(t, jwt.SigningMethodHS256, keys.secret, valid, map[string]any{"crit": []string{"exp"}}), is: jwt.ErrTokenUnverifiable, msg: "crit"},
		{name: "ES384", v: pemV, token: func() string {
			k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			return sign(t, jwt.SigningMethodES384, k, valid, nil)
		}(), is: jwt.ErrTokenSignatureInvalid, msg: "signing method ES384 is invalid"},

		// Algorithm confusion and "none".
		{name: "alg none to HMAC", v: hmacV, token: noneToken, is: jwt.ErrTokenSignatureInvalid, msg: "signing method none is invalid"},
		{name: "alg none to PEM", v: pemV, token: noneToken, is: jwt.ErrTokenSignatureInvalid},
		{name: "alg none to JWKS", v: jwksV, token: noneToken, is: jwt.ErrTokenSignatureInvalid},
		{name: "alg None by hand", v: hmacV, token: unsigned(t, map[string]any{"alg": "None", "typ": "JWT"}, valid), is: jwt.ErrTokenUnverifiable},
		{name: "no alg", v: hmacV, token: unsigned(t, map[string]any{"typ": "JWT"}, valid), is: jwt.ErrTokenUnverifiable},
		{name: "HS256 with the RSA public key PEM as secret", v: pemV, token: sign(t, jwt.SigningMethodHS256, rsaPEM, valid, nil),
			is: jwt.ErrTokenSignatureInvalid, msg: "signing method HS256 is invalid"},
		{name: "HS256 with the RSA public key PEM as secret, JWKS", v: jwksV, token: sign(t, jwt.SigningMethodHS256, rsaPEM, valid, kid("ra")),
			is: jwt.ErrTokenSignatureInvalid},
		{name: "HS256 with the HMAC secret to a public key verifier", v: pemV, token: hs(valid), is: jwt.ErrTokenSignatureInvalid},
		{name: "RS256 to HMAC only", v: hmacV, token: sign(t, jwt.SigningMethodRS256, keys.rsaA, valid, nil), is: jwt.ErrTokenSignatureInvalid, msg: "signing method RS256 is invalid"},
		{name: "ES256 to HMAC only", v: hmacV, token: sign(t, jwt.SigningMethodES256, keys.ecA, valid, nil), is: jwt.ErrTokenSignatureInvalid},

		// Required claims and their types.
		{name: "missing sub", v: hmacV, token: hs(with(valid, "sub", nil)), msg: "no sub claim"},
		{name: "empty sub", v: hmacV, token: hs(with(valid, "sub", "")), msg: "no sub claim"},
		{name: "sub of wrong type", v: hmacV, token: hs(with(valid, "sub", 42)), is: jwt.ErrTokenMalformed},
		{name: "missing org", v: hmacV, token: hs(with(valid, "org", nil)), msg: "no org claim"},
		{name: "empty org", v: pemV, token: sign(t, jwt.SigningMethodES256, keys.ecA, with(valid, "org", ""), nil), msg: "no org claim"},
		{name: "org of wrong type", v: hmacV, token: hs(with(valid, "org", 42)), is: jwt.ErrTokenMalformed},
		{name: "org is a list", v: hmacV, token: hs(with(valid, "org", []string{"acme"})), is: jwt.ErrTokenMalformed},
		{name: "team of wrong type", v: hmacV, token: hs(with(valid, "team", true)), is: jwt.ErrTokenMalformed},

		// Malformed input.
		{name: "oversize", v: hmacV, token: hs(with(valid, "pad", strings.Repeat("x", MaxTokenLen))), msg: "more than the 8192 allowed"},
		{name: "empty", v: hmacV, token: "", is: jwt.ErrTokenMalformed},
		{name: "garbage", v: hmacV, token: "not a token", is: jwt.ErrTokenMalformed},
		{name: "dots", v: pemV, token: "..", is: jwt.ErrTokenMalformed},
		{name: "four parts", v: jwksV, token: hs(valid) + ".x", is: jwt.ErrTokenMalformed},
		{name: "header not JSON", v: hmacV, token: "eyJ.eyJ.x", is: jwt.ErrTokenMalformed},
		{name: "bearer prefix left on", v: hmacV, token: "Bearer " + hs(valid), is: jwt.ErrTokenMalformed},
		{name: "padded base64", v: hmacV, token: strings.Replace(hs(valid), ".", "=.", 1), is: jwt.ErrTokenMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.v.Verify(tc.token)
			if tc.wantOK {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Fatalf("claims mismatch (-want +got):\n%s", diff)
				}
				return
			}
			if err == nil {
				t.Fatalf("Verify succeeded with %+v, want error", got)
			}
			if !errors.Is(err, ErrBadCredentials) {
				t.Errorf("error %v does not wrap ErrBadCredentials", err)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v does not wrap %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not contain %q", err, tc.msg)
			}
			if diff := cmp.Diff(Claims{}, got); diff != "" {
				t.Errorf("claims returned with the error (-want +got):\n%s", diff)
			}
		})
	}
}

// TestVerifyPKCS1 checks that "RSA PUBLIC KEY" (PKCS #1) blocks are read.
func TestVerifyPKCS1(t *testing.T) {
	keys := testKeys()
	clock := newFakeClock()
	cfg := baseConfig()
	cfg.PublicKeysFile = writeFile(t, "keys.pem", pem.EncodeToMemory(&pem.Block{
		Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&keys.rsaB.PublicKey),
	}))
	v := newTestVerifier(t, cfg, clock, nil)
	if _, err := v.Verify(sign(t, jwt.SigningMethodRS256, keys.rsaB, claimsAt(clock.Now()), nil)); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if _, err := v.Verify(sign(t, jwt.SigningMethodRS256, keys.rsaA, claimsAt(clock.Now()), nil)); !errors.Is(err, ErrBadCredentials) {
		t.Fatalf("Verify with another key: error = %v, want ErrBadCredentials", err)
	}
}

// TestVerifyNoIssuerAudience checks that iss and aud are ignored when not
// configured, and that leeway defaults to none.
func TestVerifyNoIssuerAudience(t *testing.T) {
	keys := testKeys()
	clock := newFakeClock()
	v := newTestVerifier(t, config.JWT{HMACSecretFile: writeFile(t, "secret", keys.secret)}, clock, nil)
	now := clock.Now()
	c := with(claimsAt(now), "iss", "whoever", "aud", nil)
	if _, err := v.Verify(sign(t, jwt.SigningMethodHS256, keys.secret, c, nil)); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	c = with(c, "exp", now.Add(-time.Second).Unix())
	if _, err := v.Verify(sign(t, jwt.SigningMethodHS256, keys.secret, c, nil)); !errors.Is(err, jwt.ErrTokenExpired) {
		t.Fatalf("Verify of a token expired a second ago without leeway: error = %v, want expired", err)
	}
}

// TestVerifyClock checks that a token valid now expires as the clock moves.
func TestVerifyClock(t *testing.T) {
	keys := testKeys()
	clock := newFakeClock()
	cfg := baseConfig()
	cfg.HMACSecretFile = writeFile(t, "secret", keys.secret)
	v := newTestVerifier(t, cfg, clock, nil)
	token := sign(t, jwt.SigningMethodHS256, keys.secret, claimsAt(clock.Now()), nil)
	if _, err := v.Verify(token); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	clock.Advance(time.Hour + testLeeway - time.Second)
	if _, err := v.Verify(token); err != nil {
		t.Fatalf("Verify just before exp+leeway: %v", err)
	}
	clock.Advance(2 * time.Second)
	if _, err := v.Verify(token); !errors.Is(err, jwt.ErrTokenExpired) {
		t.Fatalf("Verify after exp+leeway: error = %v, want expired", err)
	}
}

func TestJWKSRotation(t *testing.T) {
	keys := testKeys()
	clock := newFakeClock()
	logger, logs := newTestLogger()
	cfg := baseConfig()
	cfg.JWKSFile = writeFile(t, "jwks.json", jwksJSON(t, testJWK{kid: "a", pub: &keys.rsaA.PublicKey}))
	v := newTestVerifier(t, cfg, clock, logger)

	// Tokens are minted once and stay valid for an hour; the test moves
	// the clock by seconds.
	tokenA := sign(t, jwt.SigningMethodRS256, keys.rsaA, claimsAt(clock.Now()), kid("a"))
	tokenB := sign(t, jwt.SigningMethodRS256, keys.rsaB, claimsAt(clock.Now()), kid("b"))
	tokenE := sign(t, jwt.SigningMethodES256, keys.ecA, claimsAt(clock.Now()), kid("e"))
	check := func(t *testing.T, token string, wantOK bool) {
		t.Helper()
		_, err := v.Verify(token)
		if wantOK && err != nil {
			t.Fatalf("Verify: %v", err)
		}
		if !wantOK && !errors.Is(err, ErrBadCredentials) {
			t.Fatalf("Verify: error = %v, want ErrBadCredentials", err)
		}
	}
	countWarnings := func() int { return strings.Count(logs.String(), "keeping the previous keys") }

	check(t, tokenA, true)
	check(t, tokenB, false)

	t.Run("new key after the reload interval", func(t *testing.T) {
		rewrite(t, cfg.JWKSFile, jwksJSON(t, testJWK{kid: "b", pub: &keys.rsaB.PublicKey}, testJWK{kid: "e", pub: &keys.ecA.PublicKey}))
		// Not yet: the file is checked at most once per interval.
		clock.Advance(keyRereadInterval - time.Millisecond)
		check(t, tokenB, false)
		clock.Advance(time.Millisecond)
		check(t, tokenB, true)
		check(t, tokenE, true)
		check(t, tokenA, false) // rotated out
		if got := strings.Count(logs.String(), "reloaded JWT keys"); got != 1 {
			t.Errorf("%d reloads logged, want 1; logs:\n%s", got, logs)
		}
		// An unchanged file is not parsed again.
		clock.Advance(keyRereadInterval)
		check(t, tokenB, true)
		if got := strings.Count(logs.String(), "reloaded JWT keys"); got != 1 {
			t.Errorf("%d reloads logged after a check of an unchanged file, want 1; logs:\n%s", got, logs)
		}
	})

	broken := []struct {
		name    string
		content []byte // nil: delete the file
		msg     string // in the warning
	}{
		{name: "garbage", content: []byte("{not json"), msg: "not a JSON Web Key Set"},
		{name: "truncated", content: jwksJSON(t, testJWK{kid: "a", pub: &keys.rsaA.PublicKey})[:40], msg: "not a JSON Web Key Set"},
		{name: "no keys", content: []byte(`{"keys":[]}`), msg: "no keys"},
		{name: "no usable keys", content: []byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`), msg: "no usable keys"},
		{name: "deleted", content: nil, msg: "no such file"},
	}
	for _, tc := range broken {
		t.Run("keeps keys when "+tc.name, func(t *testing.T) {
			before := countWarnings()
			if tc.content == nil {
				if err := os.Remove(cfg.JWKSFile); err != nil {
					t.Fatal(err)
				}
			} else {
				rewrite(t, cfg.JWKSFile, tc.content)
			}
			clock.Advance(keyRereadInterval)
			check(t, tokenB, true)
			check(t, tokenA, false)
			if got := countWarnings(); got != before+1 {
				t.Fatalf("%d warnings logged, want 1; logs:\n%s", got-before, logs)
			}
			if !strings.Contains(logs.String(), tc.msg) {
				t.Fatalf("warning does not say %q; logs:\n%s", tc.msg, logs)
			}
			// The same broken content is reported once, not every interval.
			clock.Advance(keyRereadInterval)
			check(t, tokenB, true)
			if got := countWarnings(); got != before+1 {
				t.Fatalf("%d warnings logged after a second check, want 1", got-before)
			}
		})
	}

	t.Run("recovers", func(t *testing.T) {
		rewrite(t, cfg.JWKSFile, jwksJSON(t, testJWK{kid: "a", pub: &keys.rsaA.PublicKey}))
		clock.Advance(keyRereadInterval)
		check(t, tokenA, true)
		check(t, tokenB, false)
	})
}

func TestPEMRotation(t *testing.T) {
	keys := testKeys()
	clock := newFakeClock()
	logger, logs := newTestLogger()
	cfg := baseConfig()
	cfg.PublicKeysFile = writeFile(t, "keys.pem", pemPKIX(t, &keys.ecA.PublicKey))
	v := newTestVerifier(t, cfg, clock, logger)
	tokenA := sign(t, jwt.SigningMethodES256, keys.ecA, claimsAt(clock.Now()), nil)
	tokenB := sign(t, jwt.SigningMethodES256, keys.ecB, claimsAt(clock.Now()), nil)

	if _, err := v.Verify(tokenB); err == nil {
		t.Fatal("token of key B verified before rotation")
	}
	// Both keys during a rotation: the same length, so only the content
	// tells the files apart.
	rewrite(t, cfg.PublicKeysFile, pemPKIX(t, &keys.ecB.PublicKey))
	clock.Advance(keyRereadInterval)
	if _, err := v.Verify(tokenB); err != nil {
		t.Fatalf("Verify with the rotated key: %v", err)
	}
	if _, err := v.Verify(tokenA); err == nil {
		t.Fatal("token of the removed key A still verifies")
	}
	rewrite(t, cfg.PublicKeysFile, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	clock.Advance(keyRereadInterval)
	if _, err := v.Verify(tokenB); err != nil {
		t.Fatalf("Verify after a bad rewrite: %v", err)
	}
	if !strings.Contains(logs.String(), "keeping the previous keys") {
		t.Fatalf("bad rewrite not logged; logs:\n%s", logs)
	}
}

// TestJWKSRotationRealClock checks rotation end to end with the real clock:
// the new key is picked up within the reload interval.
func TestJWKSRotationRealClock(t *testing.T) {
	keys := testKeys()
	cfg := config.JWT{JWKSFile: writeFile(t, "jwks.json", jwksJSON(t, testJWK{kid: "a", pub: &keys.ecA.PublicKey}))}
	v, err := NewJWTVerifier(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	token := sign(t, jwt.SigningMethodES256, keys.ecB, claimsAt(time.Now()), kid("b"))
	if _, err := v.Verify(token); err == nil {
		t.Fatal("token verified before its key was added")
	}
	rewrite(t, cfg.JWKSFile, jwksJSON(t, testJWK{kid: "a", pub: &keys.ecA.PublicKey}, testJWK{kid: "b", pub: &keys.ecB.PublicKey}))

	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(5 * keyRereadInterval)
	for {
		_, err := v.Verify(token)
		if err == nil {
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("new key not picked up within %v: %v", 5*keyRereadInterval, err)
		}
	}
}

// TestVerifyConcurrentReload runs Verify from many goroutines while the key
// file changes, for the race detector.
func TestVerifyConcurrentReload(t *testing.T) {
	keys := testKeys()
	clock := newFakeClock()
	cfg := config.JWT{JWKSFile: writeFile(t, "jwks.json", jwksJSON(t, testJWK{kid: "a", pub: &keys.ecA.PublicKey}))}
	v := newTestVerifier(t, cfg, clock, nil)
	token := sign(t, jwt.SigningMethodES256, keys.ecA, claimsAt(clock.Now()), kid("a"))
	sets := [][]byte{
		jwksJSON(t, testJWK{kid: "a", pub: &keys.ecA.PublicKey}),
		jwksJSON(t, testJWK{kid: "a", pub: &keys.ecA.PublicKey}, testJWK{kid: "b", pub: &keys.ecB.PublicKey}),
	}

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if _, err := v.Verify(token); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for i := range 20 {
		rewrite(t, cfg.JWKSFile, sets[i%len(sets)])
		clock.Advance(keyRereadInterval)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Verify: %v", err)
	}
}

func TestNewJWTVerifierErrors(t *testing.T) {
	keys := testKeys()
	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	secretFile := writeFile(t, "secret", keys.secret)
	jwks := func(ks ...testJWK) config.JWT {
		return config.JWT{JWKSFile: writeFile(t, "jwks.json", jwksJSON(t, ks...))}
	}
	pemFile := func(data []byte) config.JWT { return config.JWT{PublicKeysFile: writeFile(t, "keys.pem", data)} }
	validJWKS := testJWK{kid: "ok", pub: &keys.rsaA.PublicKey}

	tests := []struct {
		name string
		cfg  config.JWT
		is   error
		msgs []string // substrings of the error
	}{
		{name: "no key source", cfg: config.JWT{}, msgs: []string{"no key source"}},
		{name: "HMAC and public keys", cfg: config.JWT{HMACSecretFile: secretFile, JWKSFile: missing}, msgs: []string{"cannot be combined"}},
		{name: "missing HMAC secret", cfg: config.JWT{HMACSecretFile: missing}, is: os.ErrNotExist, msgs: []string{missing}},
		{name: "empty HMAC secret", cfg: config.JWT{HMACSecretFile: writeFile(t, "secret", []byte(" \n\t\n"))}, msgs: []string{"is empty"}},
		{name: "short HMAC secret", cfg: config.JWT{HMACSecretFile: writeFile(t, "secret", []byte(strings.Repeat("x", 31)+"\n"))},
			msgs: []string{"31 bytes, shorter than the 32 required"}},
		{name: "missing PEM file", cfg: config.JWT{PublicKeysFile: missing}, is: os.ErrNotExist, msgs: []string{"public keys file", missing}},
		{name: "PEM with no keys", cfg: pemFile([]byte("just a comment\n")), msgs: []string{"no PEM public keys"}},
		{name: "PEM empty", cfg: pemFile(nil), msgs: []string{"no PEM public keys"}},
		{name: "PEM private key", cfg: pemFile([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")),
			msgs: []string{`PEM block 1 is "PRIVATE KEY"`}},
		{name: "PEM corrupt key", cfg: pemFile(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("garbage")})), msgs: []string{"PEM block 1"}},
		{name: "PEM weak RSA key", cfg: pemFile(append(pemPKIX(t, &keys.ecA.PublicKey), pemPKIX(t, &rsa1024.PublicKey)...)),
			msgs: []string{"PEM block 2", "1024 bits, fewer than the 2048"}},
		{name: "PEM P-384 key", cfg: pemFile(pemPKIX(t, &p384.PublicKey)), msgs: []string{"P-384", "only P-256"}},
		{name: "missing JWKS file", cfg: config.JWT{JWKSFile: missing}, is: os.ErrNotExist, msgs: []string{"JWKS file", missing}},
		{name: "JWKS not JSON", cfg: config.JWT{JWKSFile: writeFile(t, "jwks.json", []byte("keys: []"))}, msgs: []string{"not a JSON Web Key Set"}},
		{name: "JWKS empty", cfg: jwks(), msgs: []string{"no keys"}},
		{name: "JWKS oct key", cfg: jwks(testJWK{extra: map[string]any{"kty": "oct", "k": "c2VjcmV0"}}), msgs: []string{"no usable keys", `kty "oct"`}},
		{name: "JWKS P-384 key", cfg: jwks(testJWK{kid: "p", pub: &p384.PublicKey}), msgs: []string{"no usable keys", `curve "P-384"`}},
		{name: "JWKS weak RSA key", cfg: jwks(testJWK{kid: "w", pub: &rsa1024.PublicKey}), msgs: []string{"1024 bits"}},
		{name: "JWKS RS512 key", cfg: jwks(testJWK{pub: &keys.rsaA.PublicKey, extra: map[string]any{"alg": "RS512"}}), msgs: []string{`alg "RS512"`}},
		{name: "JWKS encryption key", cfg: jwks(testJWK{pub: &keys.rsaA.PublicKey, extra: map[string]any{"use": "enc"}}), msgs: []string{`use is "enc"`}},
		{name: "JWKS sign-only key_ops", cfg: jwks(testJWK{pub: &keys.ecA.PublicKey, extra: map[string]any{"key_ops": []string{"sign"}}}), msgs: []string{"lacks verify"}},
		{name: "JWKS bad base64", cfg: jwks(testJWK{pub: &keys.rsaA.PublicKey, extra: map[string]any{"n": "!!!"}}), msgs: []string{"n: illegal base64"}},
		{name: "JWKS missing e", cfg: jwks(testJWK{pub: &keys.rsaA.PublicKey, extra: map[string]any{"e": ""}}), msgs: []string{"missing e"}},
		{name: "JWKS even exponent", cfg: jwks(testJWK{pub: &keys.rsaA.PublicKey, extra: map[string]any{"e": "AQAA"}}), msgs: []string{"exponent"}},
		{name: "JWKS short EC coordinate", cfg: jwks(testJWK{pub: &keys.ecA.PublicKey, extra: map[string]any{"x": "AQAB"}}), msgs: []string{"32 bytes"}},
		{name: "JWKS EC point off the curve", cfg: jwks(testJWK{pub: &keys.ecA.PublicKey, extra: map[string]any{"y": base64.RawURLEncoding.EncodeToString(make([]byte, 32))}}),
			msgs: []string{"EC point"}},
		{name: "JWKS member of wrong type", cfg: jwks(testJWK{pub: &keys.rsaA.PublicKey, extra: map[string]any{"kid": 5}}), msgs: []string{"no usable keys"}},
		{name: "key file too large", cfg: pemFile(bytes.Repeat([]byte("#"), maxKeyFileBytes+1)), msgs: []string{"larger than"}},
	}
	// Sanity: the valid JWKS key used above is accepted on its own.
	if v, err := newJWTVerifier(jwks(validJWKS), nil, time.Now); err != nil {
		t.Fatalf("valid JWKS: %v", err)
	} else {
		v.Close()
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := NewJWTVerifier(tc.cfg, nil)
			if err == nil {
				v.Close()
				t.Fatal("NewJWTVerifier succeeded, want error")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v does not wrap %v", err, tc.is)
			}
			for _, msg := range tc.msgs {
				if !strings.Contains(err.Error(), msg) {
					t.Errorf("error %q does not contain %q", err, msg)
				}
			}
			if strings.Contains(err.Error(), string(keys.secret)) {
				t.Errorf("error %q leaks the secret", err)
			}
		})
	}
}

// TestJWKSSkipsUnusableKeys checks that a set mixing usable and unusable keys
// loads, with a warning for each skipped key.
func TestJWKSSkipsUnusableKeys(t *testing.T) {
	keys := testKeys()
	clock := newFakeClock()
	logger, logs := newTestLogger()
	cfg := baseConfig()
	cfg.JWKSFile = writeFile(t, "jwks.json", jwksJSON(t,
		testJWK{kid: "sym", extra: map[string]any{"kty": "oct", "k": base64.RawURLEncoding.EncodeToString(keys.secret)}},
		testJWK{kid: "ok", pub: &keys.ecA.PublicKey, extra: map[string]any{"alg": "ES256", "use": "sig", "key_ops": []string{"verify"}}},
		testJWK{kid: "enc", pub: &keys.rsaA.PublicKey, extra: map[string]any{"use": "enc"}},
	))
	v := newTestVerifier(t, cfg, clock, logger)
	if got := strings.Count(logs.String(), "skipping unusable JWKS key"); got != 2 {
		t.Errorf("%d keys reported skipped, want 2; logs:\n%s", got, logs)
	}
	if _, err := v.Verify(sign(t, jwt.SigningMethodES256, keys.ecA, claimsAt(clock.Now()), kid("ok"))); err != nil {
		t.Errorf("Verify with the usable key: %v", err)
	}
	// The skipped keys verify nothing, least of all an HMAC token made with
	// the "oct" key's secret.
	for name, token := range map[string]string{
		"oct":         sign(t, jwt.SigningMethodHS256, keys.secret, claimsAt(clock.Now()), kid("sym")),
		"use enc RSA": sign(t, jwt.SigningMethodRS256, keys.rsaA, claimsAt(clock.Now()), kid("enc")),
	} {
		if _, err := v.Verify(token); !errors.Is(err, ErrBadCredentials) {
			t.Errorf("%s: error = %v, want ErrBadCredentials", name, err)
		}
	}
}

func TestBearerToken(t *testing.T) {
	tests := []struct {
		header  string
		want    string
		wantErr error
	}{
		{header: "Bearer abc.def.ghi", want: "abc.def.ghi"},
		{header: "bearer abc", want: "abc"},
		{header: "BEARER abc", want: "abc"},
		{header: "  Bearer   abc  ", want: "abc"},
		{header: "", wantErr: ErrNoCredentials},
		{header: "   ", wantErr: ErrNoCredentials},
		{header: "Bearer", wantErr: ErrNoCredentials},
		{header: "Bearer    ", wantErr: ErrNoCredentials},
		{header: "Basic dXNlcjpwYXNz", wantErr: ErrNoCredentials},
		{header: "Bearerabc", wantErr: ErrNoCredentials},
		{header: "abc.def.ghi", wantErr: ErrNoCredentials},
		{header: "Token abc", wantErr: ErrNoCredentials},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.header), func(t *testing.T) {
			got, err := BearerToken(tc.header)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("BearerToken error = %v, want %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Fatalf("BearerToken = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestIdentify(t *testing.T) {
	errStorage := errors.New("disk on fire")
	employees := map[string]*policy.Employee{
		"e-1": {ID: "e-1", Org: "acme", Team: "eng", Status: policy.StatusActive},
		"e-2": {ID: "e-2", Org: "acme", Team: "ops", Status: policy.StatusInactive},
		"e-3": {ID: "e-3", Org: "acme", Team: "", Status: policy.StatusActive},
	}
	lookup := func(id string) (*policy.Employee, error) {
		if id == "broken" {
			return nil, errStorage
		}
		return employees[id], nil // nil, nil when unknown
	}
	exp := t0.Add(time.Hour)
	tests := []struct {
		name    string
		claims  Claims
		want    policy.Identity
		wantErr error
		msg     string
	}{
		{name: "active", claims: Claims{Subject: "e-1", Org: "acme", Team: "eng", Expiry: exp},
			want: policy.Identity{Org: "acme", Team: "eng", Employee: "e-1"}},
		{name: "no team in token", claims: Claims{Subject: "e-1", Org: "acme", Expiry: exp},
			want: policy.Identity{Org: "acme", Team: "eng", Employee: "e-1"}},
		{name: "employee without team", claims: Claims{Subject: "e-3", Org: "acme"},
			want: policy.Identity{Org: "acme", Employee: "e-3"}},
		{name: "unknown", claims: Claims{Subject: "e-9", Org: "acme"}, wantErr: ErrUnknownEmployee, msg: `"e-9"`},
		{name: "inactive", claims: Claims{Subject: "e-2", Org: "acme", Team: "ops"}, wantErr: ErrInactiveEmployee, msg: `status "inactive"`},
		{name: "org mismatch", claims: Claims{Subject: "e-1", Org: "globex", Team: "eng"}, wantErr: ErrForbidden,
			msg: `org "globex", the employee record has "acme": token scope does not match the employee record`},
		// The record decides the team: a token minted before a team move
		// still works, and is served the record's team.
		{name: "token names the old team", claims: Claims{Subject: "e-1", Org: "acme", Team: "ops"},
			want: policy.Identity{Org: "acme", Team: "eng", Employee: "e-1"}},
		{name: "token names a team, record has none", claims: Claims{Subject: "e-3", Org: "acme", Team: "eng"},
			want: policy.Identity{Org: "acme", Employee: "e-3"}},
		{name: "org mismatch whatever the team", claims: Claims{Subject: "e-1", Org: "globex", Team: "ops"}, wantErr: ErrForbidden,
			msg: `org "globex", the employee record has "acme"`},
		{name: "storage error", claims: Claims{Subject: "broken", Org: "acme"}, wantErr: errStorage, msg: "disk on fire"},
		{name: "no subject", claims: Claims{Org: "acme"}, wantErr: ErrBadCredentials},
	}
	authErrs := []error{ErrBadCredentials, ErrNoCredentials, ErrForbidden, ErrUnknownEmployee, ErrInactiveEmployee}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Identify(tc.claims, lookup)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("Identify error = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				if !strings.Contains(err.Error(), tc.msg) {
					t.Errorf("error %q does not contain %q", err, tc.msg)
				}
				// Exactly one sentinel: a storage failure is not an auth
				// failure, and an auth failure is only one kind.
				for _, sentinel := range authErrs {
					if !errors.Is(tc.wantErr, sentinel) && errors.Is(err, sentinel) {
						t.Errorf("error %v also wraps %v", err, sentinel)
					}
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("identity mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
