package authz

import (
	"net"
	"strconv"
	"strings"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
)

// Limits bound what one request may carry into an evaluation.
type Limits struct {
	// MaxHeaderBytes bounds the request's header names and values, with its
	// path, summed.
	MaxHeaderBytes int
	// MaxBodyBytes bounds the request body Envoy forwards.
	MaxBodyBytes int
}

// rejection is a request refused before evaluation: the HTTP status the
// proxy answers with, the metric reason and a message.
type rejection struct {
	status  int
	reason  string
	message string
}

// Rejection reasons, the values of policyd_authz_rejected_total's reason.
const (
	reasonHeaders    = "headers_too_large"
	reasonBody       = "body_too_large"
	reasonUTF8       = "invalid_utf8"
	reasonOverloaded = "overloaded"
	reasonBadRequest = "bad_request"
)

// attributes maps a CheckRequest to the CEL variable request (the table in
// docs/authz.md). Envoy's string fields arrive valid UTF-8 (protobuf
// rejects anything else); raw header values are bytes, so they are checked
// here, and a body that is not UTF-8 is offered as bytes only.
func attributes(req *authv3.CheckRequest, lim Limits) (map[string]any, *rejection) {
	a := req.GetAttributes()
	h := a.GetRequest().GetHttp()
	headers, size, rej := headerMap(h, lim.MaxHeaderBytes)
	if rej != nil {
		return nil, rej
	}
	if size+len(h.GetPath()) > lim.MaxHeaderBytes {
		return nil, &rejection{431, reasonHeaders, "request headers exceed " + strconv.Itoa(lim.MaxHeaderBytes) + " bytes"}
	}
	if len(h.GetBody())+len(h.GetRawBody()) > lim.MaxBodyBytes {
		return nil, &rejection{413, reasonBody, "request body exceeds " + strconv.Itoa(lim.MaxBodyBytes) + " bytes"}
	}
	r := map[string]any{
		"method":            h.GetMethod(),
		"path":              h.GetPath(),
		"host":              h.GetHost(),
		"scheme":            h.GetScheme(),
		"protocol":          h.GetProtocol(),
		"headers":           headers,
		"size":              h.GetSize(),
		"id":                h.GetId(),
		"source":            peer(a.GetSource()),
		"destination":       peer(a.GetDestination()),
		"contextExtensions": orEmpty(a.GetContextExtensions()),
	}
	switch {
	case h.GetBody() != "":
		r["body"] = h.GetBody()
	case len(h.GetRawBody()) > 0:
		if utf8.Valid(h.GetRawBody()) {
			r["body"] = string(h.GetRawBody())
		}
		r["rawBody"] = h.GetRawBody()
	}
	return r, nil
}

// headerMap returns the headers keyed by lower-case name, from header_map
// when Envoy sends raw headers and from headers otherwise, with the bytes
// they hold. Envoy joins repeated headers with "," in headers; header_map
// lists them apart, so they are joined the same way.
func headerMap(h *authv3.AttributeContext_HttpRequest, limit int) (map[string]string, int, *rejection) {
	size := 0
	tooLarge := &rejection{431, reasonHeaders, "request headers exceed " + strconv.Itoa(limit) + " bytes"}
	if hm := h.GetHeaderMap().GetHeaders(); len(hm) > 0 {
		out := make(map[string]string, len(hm))
		for _, hv := range hm {
			v := headerValue(hv)
			size += len(hv.GetKey()) + len(v)
			if size > limit {
				return nil, size, tooLarge
			}
			if !utf8.ValidString(v) {
				return nil, size, &rejection{400, reasonUTF8, "header " + strconv.Quote(hv.GetKey()) + " is not valid UTF-8"}
			}
			k := strings.ToLower(hv.GetKey())
			if prev, ok := out[k]; ok {
				v = prev + "," + v
			}
			out[k] = v
		}
		return out, size, nil
	}
	for k, v := range h.GetHeaders() {
		size += len(k) + len(v)
		if size > limit {
			return nil, size, tooLarge
		}
	}
	// Envoy sends header names in lower case already; CEL reads the map
	// as it is, without a copy.
	return orEmpty(h.GetHeaders()), size, nil
}

func headerValue(hv *corev3.HeaderValue) string {
	if raw := hv.GetRawValue(); len(raw) > 0 {
		return string(raw)
	}
	return hv.GetValue()
}

// peer is request.source or request.destination.
func peer(p *authv3.AttributeContext_Peer) map[string]any {
	addr := ""
	if sa := p.GetAddress().GetSocketAddress(); sa != nil {
		addr = net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10))
	} else if pipe := p.GetAddress().GetPipe(); pipe != nil {
		addr = pipe.GetPath()
	}
	return map[string]any{
		"address":   addr,
		"principal": p.GetPrincipal(),
		"service":   p.GetService(),
		"labels":    orEmpty(p.GetLabels()),
	}
}

// empty stands in for a map the request left out, so that a policy testing
// membership ("x" in request.headers) reads an empty map, not null.
var empty = map[string]string{}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return empty
	}
	return m
}
