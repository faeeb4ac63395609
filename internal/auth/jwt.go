package auth

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
)

// Sentinel errors of identity resolution, beyond those in admintokens.go.
var (
	// ErrUnknownEmployee: the token is valid but names no employee.
	// Listeners map it to 401 / Unauthenticated.
	ErrUnknownEmployee = errors.New("unknown employee")
	// ErrInactiveEmployee: the employee exists but is not active.
	// Listeners map it to 403 / PermissionDenied.
	ErrInactiveEmployee = errors.New("employee is not active")
)

const (
	// MaxTokenLen bounds the tokens Verify looks at. Sidecar tokens carry a
	// handful of short claims and are a few hundred bytes; refusing anything
	// larger before decoding keeps hostile input from costing base64 and
	// JSON work.
	MaxTokenLen = 8 << 10

	// minHMACSecretLen is the shortest HS256 secret accepted: RFC 7518,
	// section 3.2 requires a key at least as long as the hash output.
	minHMACSecretLen = 32

	// keyRereadInterval is how often, at most, the key files are re-read to
	// pick up rotated keys. The check runs inside Verify, so an idle
	// verifier does no work at all.
	keyRereadInterval = time.Second

	// minRSABits refuses RSA keys that are too weak to trust.
	minRSABits = 2048
	// maxKeyFileBytes bounds a key file read; real ones are a few KiB.
	maxKeyFileBytes = 1 << 20
)

// The signing algorithms policyd accepts, each bound to one key type.
const (
	algHS256 = "HS256" // HMAC secret only
	algRS256 = "RS256" // RSA public keys only
	algES256 = "ES256" // EC P-256 public keys only
)

// Claims are what policyd reads from a sidecar JWT.
type Claims struct {
	Subject string // sub: the employee ID
	Org     string
	Team    string
	Expiry  time.Time
}

// tokenClaims is the JSON form of a token's claims. Typed fields make a claim
// of the wrong JSON type (an org that is a number) a decoding error rather
// than something to coerce.
type tokenClaims struct {
	jwt.RegisteredClaims
	Org  string `json:"org"`
	Team string `json:"team"`
}

// verifyKey is one public key and the only algorithm it may verify.
type verifyKey struct {
	kid string // empty for PEM keys and JWKs without one
	alg string // algRS256 or algES256
	key any    // *rsa.PublicKey or *ecdsa.PublicKey
}

// keyFile is a public key file that is re-read when its content changes.
type keyFile struct {
	path  string
	what  string // for messages: "public keys file", "JWKS file"
	parse func(path string, data []byte, logger *slog.Logger) ([]verifyKey, error)

	keys atomic.Pointer[[]verifyKey]

	// Guarded by JWTVerifier.rereadMu.
	digest  [sha256.Size]byte // of the content last read, parsed or not
	lastErr string            // last reload error, so it is logged once
}

// JWTVerifier verifies sidecar tokens against an HS256 secret, or against
// RS256/ES256 public keys from a PEM file and/or a JWKS file. It is safe for
// concurrent use.
type JWTVerifier struct {
	logger *slog.Logger
	parser *jwt.Parser
	// hmac is nil unless HS256 is configured; hmacFile is re-read by Reread.
	hmac     atomic.Pointer[[]byte]
	hmacFile string
	files    []*keyFile // public key sources, reloaded on change

	now   func() time.Time
	start time.Time
	// nextCheck is when, as a duration since start, the key files are due
	// to be checked again. A duration rather than a time keeps the
	// monotonic clock: a wall clock step back must not stall reloads.
	nextCheck atomic.Int64
	rereadMu  sync.Mutex
}

// NewJWTVerifier builds a verifier from cfg. Exactly one kind of key source
// must be configured: an HMAC secret, or public keys (PEM and/or JWKS). Key
// files must hold at least one usable key; a JWKS key that cannot be used
// (another algorithm, curve or key type) is skipped with a warning.
//
// The key files are re-read when their content changes, at most once a
// second; see Verify. The HMAC secret is read again only by Reread. A nil
// logger discards the reload messages.
func NewJWTVerifier(cfg config.JWT, logger *slog.Logger) (*JWTVerifier, error) {
	return newJWTVerifier(cfg, logger, time.Now)
}

// newJWTVerifier is NewJWTVerifier with a clock, which tests set to control
// expiry and the reload interval.
func newJWTVerifier(cfg config.JWT, logger *slog.Logger, now func() time.Time) (*JWTVerifier, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	public := cfg.PublicKeysFile != "" || cfg.JWKSFile != ""
	switch {
	case cfg.HMACSecretFile == "" && !public:
		return nil, errors.New("jwt verifier: no key source: set an HMAC secret file, or a public keys file and/or a JWKS file")
	case cfg.HMACSecretFile != "" && public:
		// Config validation refuses this too. Keeping the two apart here
		// as well means no code path can ever offer a public key where an
		// HMAC secret is expected.
		return nil, errors.New("jwt verifier: an HMAC secret cannot be combined with public keys")
	}

	v := &JWTVerifier{logger: logger, now: now, start: now()}
	v.nextCheck.Store(int64(keyRereadInterval))
	var methods []string
	if cfg.HMACSecretFile != "" {
		secret, err := loadHMACSecret(cfg.HMACSecretFile)
		if err != nil {
			return nil, fmt.Errorf("jwt verifier: %w", err)
		}
		v.hmac.Store(&secret)
		v.hmacFile = cfg.HMACSecretFile
		methods = []string{algHS256}
	} else {
		methods = []string{algRS256, algES256}
	}
	if cfg.PublicKeysFile != "" {
		v.files = append(v.files, &keyFile{path: cfg.PublicKeysFile, what: "public keys file", parse: parsePEMKeys})
	}
	if cfg.JWKSFile != "" {
		v.files = append(v.files, &keyFile{path: cfg.JWKSFile, what: "JWKS file", parse: parseJWKS})
	}
	for _, f := range v.files {
		data, err := readKeyFile(f.path)
		if err != nil {
			return nil, fmt.Errorf("jwt verifier: %s: %w", f.what, err)
		}
		keys, err := f.parse(f.path, data, logger)
		if err != nil {
			return nil, fmt.Errorf("jwt verifier: %s: %w", f.what, err)
		}
		f.digest = sha256.Sum256(data)
		f.keys.Store(&keys)
	}

	opts := []jwt.ParserOption{
		jwt.WithValidMethods(methods),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(cfg.Leeway),
		jwt.WithTimeFunc(now),
		jwt.WithStrictDecoding(),
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// Verify checks token (the compact JWS, without "Bearer ") and returns its
// claims. The signature must verify with a configured key of the token's
// algorithm (HS256 with the HMAC secret; RS256 with an RSA key; ES256 with an
// EC P-256 key; never "none"). A token with a kid is checked against the JWKS
// keys with that kid and the keys that have no kid (all PEM keys); one
// without a kid against every key of its algorithm. exp is required; exp,
// nbf and iat are checked with the configured leeway, iss and aud when
// configured. sub and org are required strings, team an optional string.
//
// Every failure wraps ErrBadCredentials and says why; the golang-jwt error
// (jwt.ErrTokenExpired...) is wrapped too.
//
// At most once a second, Verify first re-reads the key files
// and swaps in their keys if the content changed. A file that fails to read
// or parse keeps the previous keys and logs a warning.
func (v *JWTVerifier) Verify(token string) (Claims, error) {
	if len(token) > MaxTokenLen {
		return Claims{}, fmt.Errorf("%w: token is %d bytes, more than the %d allowed", ErrBadCredentials, len(token), MaxTokenLen)
	}
	v.maybeReread()

	var tc tokenClaims
	if _, err := v.parser.ParseWithClaims(token, &tc, v.keyFunc); err != nil {
		return Claims{}, fmt.Errorf("%w: %w", ErrBadCredentials, err)
	}
	switch {
	case tc.Subject == "":
		return Claims{}, fmt.Errorf("%w: token has no sub claim", ErrBadCredentials)
	case tc.Org == "":
		return Claims{}, fmt.Errorf("%w: token has no org claim", ErrBadCredentials)
	}
	// WithExpirationRequired guarantees ExpiresAt; the check only keeps a
	// library change from turning into a nil dereference.
	if tc.ExpiresAt == nil {
		return Claims{}, fmt.Errorf("%w: token has no exp claim", ErrBadCredentials)
	}
	return Claims{Subject: tc.Subject, Org: tc.Org, Team: tc.Team, Expiry: tc.ExpiresAt.Time}, nil
}

// keyFunc returns the keys that may verify t. The algorithm, already limited
// to the configured key kind by WithValidMethods, selects the key type, so a
// public key is never used as an HMAC secret and an HMAC secret never
// stands in for a public key.
func (v *JWTVerifier) keyFunc(t *jwt.Token) (any, error) {
	// RFC 7515 section 4.1.11: extensions we do not understand must be
	// refused, not ignored.
	if _, ok := t.Header["crit"]; ok {
		return nil, errors.New("crit header is not supported")
	}
	alg := t.Method.Alg()
	if alg == algHS256 {
		secret := v.hmac.Load()
		if secret == nil {
			return nil, errors.New("HS256 is not accepted: no HMAC secret is configured")
		}
		return *secret, nil
	}
	if alg != algRS256 && alg != algES256 {
		return nil, fmt.Errorf("algorithm %q is not accepted", alg)
	}
	kid := ""
	if raw, ok := t.Header["kid"]; ok {
		s, ok := raw.(string)
		if !ok {
			return nil, errors.New("kid header is not a string")
		}
		kid = s
	}
	var set jwt.VerificationKeySet
	for _, f := range v.files {
		for _, k := range *f.keys.Load() {
			if k.alg == alg && (kid == "" || k.kid == "" || k.kid == kid) {
				set.Keys = append(set.Keys, k.key)
			}
		}
	}
	if len(set.Keys) == 0 {
		if kid != "" {
			return nil, fmt.Errorf("no %s key with kid %q", alg, kid)
		}
		return nil, fmt.Errorf("no %s key is configured", alg)
	}
	return set, nil
}

// maybeReread re-reads the key files if keyRereadInterval has passed since
// the last check. Reading the whole (small) file and comparing digests
// rather than trusting mtime and size catches a rewrite within the mtime
// granularity and a same-size key swap, and works for files replaced by
// rename or symlink swap (Kubernetes ConfigMaps).
func (v *JWTVerifier) maybeReread() {
	if len(v.files) == 0 {
		return
	}
	elapsed := v.now().Sub(v.start)
	if int64(elapsed) < v.nextCheck.Load() {
		return
	}
	// Whoever gets the lock reloads; the others go on with the current
	// keys rather than queue behind file I/O.
	if !v.rereadMu.TryLock() {
		return
	}
	defer v.rereadMu.Unlock()
	if int64(elapsed) < v.nextCheck.Load() {
		return // reloaded while we were getting the lock
	}
	v.nextCheck.Store(int64(elapsed + keyRereadInterval))
	for _, f := range v.files {
		_ = v.reread(f) // logged
	}
}

// Reread re-reads the HMAC secret and the key files now (SIGHUP) rather than
// at the next check. A source that fails to read or parse keeps its previous
// keys, is logged, and its error is returned (joined with the others'); the
// sources that loaded are in use either way.
func (v *JWTVerifier) Reread() error {
	v.rereadMu.Lock()
	defer v.rereadMu.Unlock()
	var errs []error
	if v.hmacFile != "" {
		secret, err := loadHMACSecret(v.hmacFile)
		switch {
		case err != nil:
			v.logger.Error("cannot reload the JWT HMAC secret; keeping the previous one", "file", v.hmacFile, "err", err)
			errs = append(errs, err)
		case !bytes.Equal(secret, *v.hmac.Load()):
			v.hmac.Store(&secret)
			v.logger.Info("reloaded JWT HMAC secret", "file", v.hmacFile)
		}
	}
	for _, f := range v.files {
		if err := v.reread(f); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.what, err))
		}
	}
	v.nextCheck.Store(int64(v.now().Sub(v.start) + keyRereadInterval))
	return errors.Join(errs...)
}

// reread re-reads f and swaps in its keys if its content changed. It returns
// the error that keeps f on its previous keys, if any: this read's, or the
// parse error of unchanged content. Called with rereadMu held.
func (v *JWTVerifier) reread(f *keyFile) error {
	data, err := readKeyFile(f.path)
	if err != nil {
		// Forget the digest: content that reappears must be parsed again.
		f.digest = [sha256.Size]byte{}
		v.rereadFailed(f, err)
		return err
	}
	digest := sha256.Sum256(data)
	if digest == f.digest {
		if f.lastErr != "" {
			return errors.New(f.lastErr)
		}
		return nil
	}
	// Remember the digest even if parsing fails, so that one bad version
	// is reported once rather than every interval; the next write changes
	// the digest and is tried again.
	f.digest = digest
	keys, err := f.parse(f.path, data, v.logger)
	if err != nil {
		v.rereadFailed(f, err)
		return err
	}
	f.keys.Store(&keys)
	f.lastErr = ""
	v.logger.Info("reloaded JWT keys", "file", f.path, "keys", len(keys))
	return nil
}

func (v *JWTVerifier) rereadFailed(f *keyFile, err error) {
	if msg := err.Error(); msg != f.lastErr {
		f.lastErr = msg
		v.logger.Warn("cannot reload JWT "+f.what+"; keeping the previous keys",
			"file", f.path, "keys", len(*f.keys.Load()), "err", err)
	}
}

// Close releases the verifier. Reloading runs inside Verify, so there is no
// background work to stop; Close exists so that callers need not change if
// that ever does. It is safe to call more than once.
func (v *JWTVerifier) Close() error { return nil }

// loadHMACSecret reads an HS256 secret. Surrounding whitespace is dropped, as
// editors and `echo` add a trailing newline that is not meant to be part of
// the secret. Errors never include the secret.
func loadHMACSecret(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("HMAC secret: %w", err)
	}
	secret := bytes.TrimSpace(data)
	switch {
	case len(secret) == 0:
		return nil, fmt.Errorf("HMAC secret %s is empty", path)
	case len(secret) < minHMACSecretLen:
		return nil, fmt.Errorf("HMAC secret in %s is %d bytes, shorter than the %d required", path, len(secret), minHMACSecretLen)
	}
	return secret, nil
}

// readKeyFile reads a key file, refusing one too large to be a key file.
func readKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxKeyFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxKeyFileBytes)
	}
	return data, nil
}

// parsePEMKeys parses PEM public keys: "PUBLIC KEY" (PKIX, RSA or EC P-256)
// and "RSA PUBLIC KEY" (PKCS #1) blocks. Text between blocks is ignored, as
// PEM files often carry comments. Any other block is an error rather than
// skipped: a private key or certificate here is a mistake worth reporting.
func parsePEMKeys(path string, data []byte, _ *slog.Logger) ([]verifyKey, error) {
	var keys []verifyKey
	rest := data
	for n := 1; ; n++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		var pub any
		var err error
		switch block.Type {
		case "PUBLIC KEY":
			pub, err = x509.ParsePKIXPublicKey(block.Bytes)
		case "RSA PUBLIC KEY":
			pub, err = x509.ParsePKCS1PublicKey(block.Bytes)
		default:
			return nil, fmt.Errorf("%s: PEM block %d is %q, want PUBLIC KEY or RSA PUBLIC KEY", path, n, block.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: PEM block %d: %w", path, n, err)
		}
		k, err := newVerifyKey("", pub)
		if err != nil {
			return nil, fmt.Errorf("%s: PEM block %d: %w", path, n, err)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: no PEM public keys", path)
	}
	return keys, nil
}

// newVerifyKey binds pub to the one algorithm it may verify.
func newVerifyKey(kid string, pub any) (verifyKey, error) {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if bits := k.N.BitLen(); bits < minRSABits {
			return verifyKey{}, fmt.Errorf("RSA key has %d bits, fewer than the %d required", bits, minRSABits)
		}
		return verifyKey{kid: kid, alg: algRS256, key: k}, nil
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return verifyKey{}, fmt.Errorf("EC key is on curve %s, only P-256 (ES256) is accepted", k.Curve.Params().Name)
		}
		return verifyKey{kid: kid, alg: algES256, key: k}, nil
	}
	return verifyKey{}, fmt.Errorf("unsupported key type %T, want RSA or EC P-256", pub)
}

// jwk is the part of a JSON Web Key (RFC 7517, 7518) that policyd reads.
type jwk struct {
	Kty    string   `json:"kty"`
	Kid    string   `json:"kid"`
	Use    string   `json:"use"`
	Alg    string   `json:"alg"`
	KeyOps []string `json:"key_ops"`
	N      string   `json:"n"`
	E      string   `json:"e"`
	Crv    string   `json:"crv"`
	X      string   `json:"x"`
	Y      string   `json:"y"`
}

// parseJWKS parses a JSON Web Key Set. Keys policyd cannot use (another key
// type, curve, algorithm or use, or malformed) are skipped with a warning,
// since a set shared with other services may well hold some; a set with no
// usable key at all is an error. Symmetric ("oct") keys are never used: a
// key set is public.
func parseJWKS(path string, data []byte, logger *slog.Logger) ([]verifyKey, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("%s: not a JSON Web Key Set: %w", path, err)
	}
	var keys []verifyKey
	var skipped []error
	for i, raw := range set.Keys {
		k, err := parseJWK(raw)
		if err != nil {
			err = fmt.Errorf("key %d: %w", i, err)
			skipped = append(skipped, err)
			logger.Warn("skipping unusable JWKS key", "file", path, "err", err)
			continue
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		if len(skipped) == 0 {
			return nil, fmt.Errorf("%s: no keys", path)
		}
		return nil, fmt.Errorf("%s: no usable keys: %w", path, errors.Join(skipped...))
	}
	return keys, nil
}

func parseJWK(raw json.RawMessage) (verifyKey, error) {
	var j jwk
	if err := json.Unmarshal(raw, &j); err != nil {
		return verifyKey{}, err
	}
	if j.Use != "" && j.Use != "sig" {
		return verifyKey{}, fmt.Errorf("use is %q, not sig", j.Use)
	}
	if j.KeyOps != nil && !slices.Contains(j.KeyOps, "verify") {
		return verifyKey{}, fmt.Errorf("key_ops %q lacks verify", j.KeyOps)
	}
	var pub any
	var alg string
	switch j.Kty {
	case "RSA":
		alg = algRS256
		n, err := decodeB64URL("n", j.N)
		if err != nil {
			return verifyKey{}, err
		}
		e, err := decodeB64URL("e", j.E)
		if err != nil {
			return verifyKey{}, err
		}
		// crypto/rsa wants an odd exponent that fits in 31 bits; 65537
		// is what everyone uses.
		eInt := new(big.Int).SetBytes(e)
		if eInt.BitLen() > 31 || eInt.Int64() < 3 || eInt.Bit(0) == 0 {
			return verifyKey{}, errors.New("RSA exponent e is not an odd number between 3 and 2^31")
		}
		nInt := new(big.Int).SetBytes(n)
		if nInt.Bit(0) == 0 {
			return verifyKey{}, errors.New("RSA modulus n is even")
		}
		pub = &rsa.PublicKey{N: nInt, E: int(eInt.Int64())}
	case "EC":
		alg = algES256
		if j.Crv != "P-256" {
			return verifyKey{}, fmt.Errorf("EC curve %q is not accepted, only P-256 (ES256)", j.Crv)
		}
		x, err := decodeB64URL("x", j.X)
		if err != nil {
			return verifyKey{}, err
		}
		y, err := decodeB64URL("y", j.Y)
		if err != nil {
			return verifyKey{}, err
		}
		// RFC 7518 section 6.2.1.2: coordinates are full-length.
		if len(x) != 32 || len(y) != 32 {
			return verifyKey{}, errors.New("EC coordinates x and y must be 32 bytes each for P-256")
		}
		k, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), slices.Concat([]byte{4}, x, y))
		if err != nil {
			return verifyKey{}, fmt.Errorf("EC point: %w", err)
		}
		pub = k
	default:
		return verifyKey{}, fmt.Errorf("kty %q is not accepted, want RSA or EC", j.Kty)
	}
	if j.Alg != "" && j.Alg != alg {
		return verifyKey{}, fmt.Errorf("alg %q is not accepted for a %s key, only %s", j.Alg, j.Kty, alg)
	}
	return newVerifyKey(j.Kid, pub)
}

// decodeB64URL decodes a JWK member: base64url without padding (RFC 7515,
// section 2), though padding is tolerated as some tools emit it.
func decodeB64URL(name, s string) ([]byte, error) {
	if s == "" {
		return nil, fmt.Errorf("missing %s", name)
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return b, nil
}

// BearerToken extracts the token from an Authorization header value,
// "Bearer <token>". The scheme is case-insensitive (RFC 9110, section 11.1)
// and surrounding whitespace is ignored. A missing header, another scheme or
// an empty token is ErrNoCredentials.
func BearerToken(header string) (string, error) {
	scheme, token, _ := strings.Cut(strings.TrimSpace(header), " ")
	token = strings.TrimSpace(token)
	if !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", ErrNoCredentials
	}
	return token, nil
}

// Identify resolves verified claims to the identity policies are scoped by.
// The employee record is authoritative: the identity returned is the
// record's. The token's org must agree with it, since an org is a tenant;
// its team need not, since the record decides the team and a sidecar whose
// employee moved team keeps working until its token is refreshed.
//
// lookup returns the employee with the given ID: (emp, nil) if it exists,
// (nil, nil) if it does not, and (nil, err) if it could not be read. Identify
// returns
//
//   - ErrUnknownEmployee (wrapped) if there is no such employee;
//   - ErrInactiveEmployee (wrapped) if the employee is not active;
//   - ErrForbidden (wrapped) if the token's org differs from the record's:
//     a token minted for another tenant (or for the employee's old org)
//     must never be honoured;
//   - lookup's error, wrapped, if the record could not be read: that is a
//     storage failure, not an authentication one.
func Identify(c Claims, lookup func(id string) (*policy.Employee, error)) (policy.Identity, error) {
	if c.Subject == "" {
		// Verify never returns such claims; refuse rather than look up "".
		return policy.Identity{}, fmt.Errorf("%w: claims have no subject", ErrBadCredentials)
	}
	emp, err := lookup(c.Subject)
	if err != nil {
		return policy.Identity{}, fmt.Errorf("look up employee %q: %w", c.Subject, err)
	}
	if emp == nil {
		return policy.Identity{}, fmt.Errorf("employee %q: %w", c.Subject, ErrUnknownEmployee)
	}
	if !emp.Active() {
		return policy.Identity{}, fmt.Errorf("employee %q has status %q: %w", c.Subject, emp.Status, ErrInactiveEmployee)
	}
	if c.Org != emp.Org {
		return policy.Identity{}, fmt.Errorf("token for employee %q has org %q, the employee record has %q: token scope does not match the employee record: %w",
			c.Subject, c.Org, emp.Org, ErrForbidden)
	}
	return emp.Identity(), nil
}
