"""No module of tui imports itself back through others: every circle is a design smell (two
modules that are one), and the simulation's were broken by giving what both need a module of
its own (tui/sim/scenarios.py, tui/sim/remote_rank.py). TYPE_CHECKING imports count too."""

from __future__ import annotations

import grimp


def test_no_import_cycles_in_tui() -> None:
    graph = grimp.build_graph("tui")
    circles = sorted({tuple(sorted((module, imported)))
                      for module in graph.modules
                      for imported in graph.find_modules_directly_imported_by(module)
                      if graph.chain_exists(importer=imported, imported=module)})
    assert circles == []
