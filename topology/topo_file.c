/*
 * topo_file.c — a topology file of either kind (what ZCCL_TOPO_FILE names): the XML root element tells hwloc
 * exports (<topology>) from NCCL files (<system>). libxml2's streaming reader stops at the root element, so a large
 * hwloc export is not parsed twice.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <libxml/xmlreader.h>
#include "topo_model.h"

zccl_result_t zccl__topo_xml_root(const char *path, char *name, size_t len) {
    FILE *f = fopen(path, "r");
    if (!f) return zccl__error(ZCCL_INVALID_ARGUMENT, "cannot open topology file %s: %s", path, strerror(errno));
    fclose(f);
    xmlTextReaderPtr reader = xmlReaderForFile(path, NULL, XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    if (!reader) return zccl__error(ZCCL_INVALID_ARGUMENT, "cannot read topology file %s as XML", path);
    int ret;
    name[0] = '\0';
    while ((ret = xmlTextReaderRead(reader)) == 1) {
        if (xmlTextReaderNodeType(reader) == XML_READER_TYPE_ELEMENT) {
            const xmlChar *n = xmlTextReaderConstName(reader);
            snprintf(name, len, "%s", n ? (const char *)n : "");
            break;
        }
    }
    xmlFreeTextReader(reader);
    if (!name[0])
        return zccl__error(ZCCL_INVALID_ARGUMENT, "topology file %s is not XML (no root element could be read)", path);
    return ZCCL_SUCCESS;
}

zccl_result_t zccl_topo_create_file(const char *path, unsigned flags, zccl_topo_t **out) {
    if (!path || !*path || !out) return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_topo_create_file: no path");
    char root[64];
    ZCCL_CHECK(zccl__topo_xml_root(path, root, sizeof root));
    if (strcmp(root, "topology") == 0) return zccl_topo_create_hwloc_xml(path, flags, out);
    if (strcmp(root, "system") == 0) return zccl_topo_create_nccl_xml(path, flags, out);
    return zccl__error(ZCCL_INVALID_ARGUMENT,
                       "topology file %s has root element <%s>: expected <topology> (hwloc XML) or <system> (NCCL)",
                       path, root);
}
