package command

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	commandv1 "github.com/policyd/policyd/api/command/v1"
)

// Command is a command on its way to the log with its payload decoded: built
// where the write is taken, admitted by the leader, and encoded once, into
// the entry. The fields beside Body are the envelope's (commandv1.Command).
type Command struct {
	Body                 *commandv1.Body
	OriginatedAtUnixNano int64
	ProcessedAtUnixNano  int64
	Actor                string
	RequestID            string
	RevertedTo           uint64

	// unknown is the type of a decoded entry that Body has no field for
	// (one marked IgnoreUnknown, from a newer node), and raw its payload,
	// kept so that the entry can be written on as it came.
	unknown Type
	raw     []byte
}

var (
	kindOneof = (&commandv1.Body{}).ProtoReflect().Descriptor().Oneofs().ByName("kind")
	// kindOf maps each payload message to its Body field, so New needs no
	// table of its own.
	kindOf = func() map[protoreflect.FullName]protoreflect.FieldDescriptor {
		m := map[protoreflect.FullName]protoreflect.FieldDescriptor{}
		fs := kindOneof.Fields()
		for i := range fs.Len() {
			m[fs.Get(i).Message().FullName()] = fs.Get(i)
		}
		return m
	}()
)

// New is the command whose payload is msg, one of Body's messages.
func New(msg proto.Message) (*Command, error) {
	fd, ok := kindOf[msg.ProtoReflect().Descriptor().FullName()]
	if !ok {
		return nil, fmt.Errorf("%T is not a command payload", msg)
	}
	b := &commandv1.Body{}
	b.ProtoReflect().Set(fd, protoreflect.ValueOfMessage(msg.ProtoReflect()))
	return &Command{Body: b}, nil
}

// Type is c's type byte: its Body field's number.
func (c *Command) Type() Type {
	if fd := c.Body.ProtoReflect().WhichOneof(kindOneof); fd != nil {
		return Type(fd.Number())
	}
	return c.unknown
}

// Payload is c's payload message; nil for an unknown type.
func (c *Command) Payload() proto.Message {
	fd := c.Body.ProtoReflect().WhichOneof(kindOneof)
	if fd == nil {
		return nil
	}
	return c.Body.ProtoReflect().Get(fd).Message().Interface()
}

// Encode is c as the envelope the log and the peer plane carry.
func Encode(c *Command) (*commandv1.Command, error) {
	env := &commandv1.Command{
		Type: uint32(c.Type()), OriginatedAtUnixNano: c.OriginatedAtUnixNano, ProcessedAtUnixNano: c.ProcessedAtUnixNano,
		Actor: c.Actor, RequestId: c.RequestID, RevertedTo: c.RevertedTo, Payload: c.raw,
	}
	if msg := c.Payload(); msg != nil {
		b, err := proto.Marshal(msg)
		if err != nil {
			return nil, fmt.Errorf("encode command type %d: %w", env.Type, err)
		}
		env.Payload = b
	} else if c.unknown == 0 {
		return nil, fmt.Errorf("encode command: no payload")
	}
	return env, nil
}

// Decode is env with its payload decoded: the one place a payload is read.
// An unknown type is an error unless it carries IgnoreUnknown; then the
// command has no Body and its payload is kept as it came.
func Decode(env *commandv1.Command) (*Command, error) {
	if env.GetType() > 0xff {
		return nil, fmt.Errorf("command type %d is not a byte", env.GetType())
	}
	t := Type(env.GetType())
	c := &Command{
		OriginatedAtUnixNano: env.GetOriginatedAtUnixNano(), ProcessedAtUnixNano: env.GetProcessedAtUnixNano(),
		Actor: env.GetActor(), RequestID: env.GetRequestId(), RevertedTo: env.GetRevertedTo(),
	}
	fd := kindOneof.Fields().ByNumber(protowire.Number(t))
	if fd == nil {
		if t&IgnoreUnknown == 0 {
			return nil, fmt.Errorf("unknown command type %d (0x%02x) without the ignore flag; this node is older than the cluster", t, uint8(t))
		}
		c.unknown, c.raw = t, env.GetPayload()
		return c, nil
	}
	c.Body = &commandv1.Body{}
	msg := c.Body.ProtoReflect().NewField(fd).Message()
	if err := proto.Unmarshal(env.GetPayload(), msg.Interface()); err != nil {
		return nil, fmt.Errorf("decode %T: %w", msg.Interface(), err)
	}
	c.Body.ProtoReflect().Set(fd, protoreflect.ValueOfMessage(msg))
	return c, nil
}

// Marshal is c as a log entry's bytes.
func Marshal(c *Command) ([]byte, error) {
	env, err := Encode(c)
	if err != nil {
		return nil, err
	}
	return proto.Marshal(env)
}

// Unmarshal decodes a log entry's bytes.
func Unmarshal(data []byte) (*Command, error) {
	var env commandv1.Command
	if err := proto.Unmarshal(data, &env); err != nil {
		return nil, fmt.Errorf("decode command envelope: %w", err)
	}
	return Decode(&env)
}

// Clone is a deep copy of c.
func (c *Command) Clone() *Command {
	cp := *c
	cp.Body = proto.CloneOf(c.Body)
	return &cp
}
