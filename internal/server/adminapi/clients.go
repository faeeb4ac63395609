package adminapi

import (
	"context"
	"net/http"
	"time"

	clusterv1 "github.com/policyd/policyd/api/cluster/v1"
)

// ClientsView is GET /v1/clients.
type ClientsView struct {
	Clients []ClientView `json:"clients"`
	// Unreachable lists members that did not answer; their sidecars are
	// missing from Clients.
	Unreachable []string `json:"unreachable_nodes,omitempty"`
}

// ClientView is one connected sidecar.
type ClientView struct {
	Node          string    `json:"node"`
	ClientAddress string    `json:"client_address"`
	Transport     string    `json:"transport"`
	Org           string    `json:"org"`
	Team          string    `json:"team"`
	Employee      string    `json:"employee"`
	Version       string    `json:"version"`
	State         string    `json:"state"`
	AckedVersion  string    `json:"acked_version,omitempty"`
	NackMessage   string    `json:"nack_message,omitempty"`
	NackVersion   string    `json:"nack_version,omitempty"`
	ConnectedAt   time.Time `json:"connected_at"`
	LastActive    time.Time `json:"last_health_check"`
	PeerAddr      string    `json:"peer_addr,omitempty"`
}

func (a *API) listClients(w http.ResponseWriter, r *http.Request) error {
	clients, unreachable, err := a.b.Clients(r.Context())
	if err != nil {
		return err
	}
	view := ClientsView{Clients: make([]ClientView, 0, len(clients)), Unreachable: unreachable}
	for _, c := range clients {
		view.Clients = append(view.Clients, ClientView{
			Node:          c.GetNodeId(),
			ClientAddress: c.GetClientAddress(),
			Transport:     c.GetTransport(),
			Org:           c.GetOrg(),
			Team:          c.GetTeam(),
			Employee:      c.GetEmployee(),
			Version:       c.GetVersionSent(),
			State:         c.GetState(),
			AckedVersion:  c.GetVersionAcked(),
			NackMessage:   c.GetNackMessage(),
			NackVersion:   c.GetNackVersion(),
			ConnectedAt:   time.Unix(0, c.GetConnectedAtUnixNano()).UTC(),
			LastActive:    time.Unix(0, c.GetLastActiveUnixNano()).UTC(),
			PeerAddr:      c.GetPeerAddr(),
		})
	}
	writeJSON(w, http.StatusOK, view)
	return nil
}

// clientsLister is the part of Backend that lists sidecars.
type clientsLister interface {
	// Clients lists the sidecars connected to every member, asking the
	// others over the internal API. Members that did not answer are named in
	// unreachable.
	Clients(ctx context.Context) (clients []*clusterv1.ClientInfo, unreachable []string, err error)
}
