"""Token-route lottery tickets: small sets of KV entries that still yield the answer."""

from kvroute.tickets.save import load_ticket_mask, save_ticket
from kvroute.tickets.search import Ticket, TicketSettings, find_ticket, importance

__all__ = ["Ticket", "TicketSettings", "find_ticket", "importance", "load_ticket_mask", "save_ticket"]
