package grpccodec

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rawCodec is a client codec that sends []byte as it is: protobuf-go will
// not marshal invalid UTF-8, so the tests write the wire format by hand.
type rawCodec struct{ encoding.CodecV2 }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.([]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// serve starts a gRPC server with c's options and the standard health
// service, and returns a client connection that sends raw requests.
func serve(t *testing.T, c *Codec) *grpc.ClientConn {
	t.Helper()
	srv := grpc.NewServer(c.ServerOptions()...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(protoenc.Name)})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		srv.Stop()
		<-done
	})
	return cc
}

// healthRequest is a grpc.health.v1.HealthCheckRequest naming service.
func healthRequest(service string) []byte {
	return protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), service)
}

// TestInvalidUTF8IsInvalidArgument: a unary call and a stream whose request
// holds invalid UTF-8 get InvalidArgument naming the field, and the
// handler never runs (the health service would answer NotFound for an
// unknown service); valid requests are served as before, and no note is
// left behind.
func TestInvalidUTF8IsInvalidArgument(t *testing.T) {
	c := New(encoding.GetCodecV2(protoenc.Name))
	cc := serve(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	tests := []struct {
		name    string
		service string
		code    codes.Code
	}{
		{"valid, served", "", codes.OK},
		{"valid, unknown service", "nope", codes.NotFound},
		{"invalid UTF-8", "a\xffb", codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run("unary "+tc.name, func(t *testing.T) {
			var resp healthpb.HealthCheckResponse
			err := cc.Invoke(ctx, healthpb.Health_Check_FullMethodName, healthRequest(tc.service), &resp)
			checkStatus(t, err, tc.code)
		})
		t.Run("stream "+tc.name, func(t *testing.T) {
			sctx, scancel := context.WithCancel(ctx)
			defer scancel()
			st, err := cc.NewStream(sctx, &healthpb.Health_ServiceDesc.Streams[0], healthpb.Health_Watch_FullMethodName)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.SendMsg(healthRequest(tc.service)); err != nil {
				t.Fatal(err)
			}
			var resp healthpb.HealthCheckResponse
			err = st.RecvMsg(&resp)
			if tc.code == codes.NotFound {
				// Watch answers an unknown service with SERVICE_UNKNOWN.
				if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVICE_UNKNOWN {
					t.Fatalf("Watch = %v, %v", resp.GetStatus(), err)
				}
				return
			}
			checkStatus(t, err, tc.code)
		})
	}
	if n := c.notes.Load(); n != 0 {
		t.Fatalf("%d notes left behind", n)
	}
}

func checkStatus(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("code %v (%v), want %v", got, err, want)
	}
	if want == codes.InvalidArgument && !strings.Contains(status.Convert(err).Message(), "service is not valid UTF-8") {
		t.Fatalf("message %q does not name the field", status.Convert(err).Message())
	}
}
