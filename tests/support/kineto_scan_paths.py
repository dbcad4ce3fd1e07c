"""A Kineto trace read by every scan path the importer has (the dict scan, msgspec,
the C scan where built), each giving the table the import builds on."""

import json

from diagnose.importers import kineto, kineto_scan
from diagnose.importers.kineto_columns import table_and_facts


def scan_path_tables(trace: dict) -> list:
    """The table of every scan path: dict (kineto._scan_events), msgspec, C."""
    raw = json.dumps(trace).encode()
    tables = [kineto.trace_table(trace)[0]]
    scanned = [kineto_scan._scan(kineto_scan._TRACE.decode(raw), False, kineto._classify)]
    if kineto_scan._kineto_c is not None:
        scanned.append(kineto_scan.native_scan(raw, False, kineto._classify))
    for facts, *rest in scanned:
        tables.append(table_and_facts(facts["baseTimeNanoseconds"], facts["distributedInfo"], *rest)[0])
    return tables
