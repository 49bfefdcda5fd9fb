"""The conversation items of one Realtime connection: which item id stands for what in the session.

The API names every item of the conversation by an id the client may choose (``conversation.item.create``)
or the server makes (a spoken user turn, an assistant reply), chains them by ``previous_item_id`` and lets the
client retrieve, truncate or delete them. The session knows turns and history entries, not item ids; this
store is the map between the two:

* an item of a turn (a spoken user turn, a user audio item, an assistant reply): ``turn_id`` and ``role``,
  its text found in the session by :meth:`~omniduplex.app.core.session.Session.entry`;
* a typed message (``input_text`` / ``text`` content): the history ``entry`` it became.

Each item has a ``type``: ``"message"`` today; the API's other item types (``function_call``,
``function_call_output``, ``mcp_call``...) are stored the same way, by type, when the surface handles them.
"""

from __future__ import annotations

from typing import NamedTuple

from omniduplex.app.core.history import Entry

MESSAGE = "message"
"""The item type of a message (user, assistant or system)."""


class StoredItem(NamedTuple):
    """One item as the connection knows it: ``turn_id`` of the session turn it belongs to (``None`` for a
    typed message, held by its history ``entry``), ``role`` (``user`` / ``assistant`` / ``system`` for
    messages), ``type`` (the API's item type)."""

    turn_id: str | None
    role: str
    type: str = MESSAGE
    entry: Entry | None = None


class ConversationItems:
    """The connection's items by id, and the last item of the conversation (for ``previous_item_id``)."""

    def __init__(self) -> None:
        self._items: dict[str, StoredItem] = {}
        self.last: str | None = None
        """The id of the newest item added to the conversation (``None`` before the first)."""

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._items

    def __getitem__(self, item_id: str) -> StoredItem:
        return self._items[item_id]

    def get(self, item_id: str) -> StoredItem | None:
        """The item ``item_id`` (``None``: unknown)."""
        return self._items.get(item_id)

    def put(self, item_id: str, item: StoredItem) -> None:
        """Record ``item`` under ``item_id`` (not chained: see :meth:`append`)."""
        self._items[item_id] = item

    def append(self, item_id: str, item: StoredItem | None = None) -> str | None:
        """Make ``item_id`` the newest item of the conversation (recording ``item`` when given); returns the
        previous newest (its ``previous_item_id``)."""
        if item is not None:
            self._items[item_id] = item
        prev, self.last = self.last, item_id
        return prev

    def pop(self, item_id: str) -> StoredItem | None:
        """Forget item ``item_id``; the item it was (``None``: unknown)."""
        return self._items.pop(item_id, None)

    def of_turn(self, turn_id: str, role: str, type: str = MESSAGE) -> str | None:
        """The id of turn ``turn_id``'s ``role`` item of ``type`` (``None``: none)."""
        return next(
            (i for i, it in self._items.items() if (it.turn_id, it.role, it.type) == (turn_id, role, type)),
            None,
        )
