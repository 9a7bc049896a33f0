# Runs at install time (install(SCRIPT)), when CMAKE_INSTALL_PREFIX is the prefix being
# installed into: writes <libdir>/pkgconfig/meshalloc.pc from meshalloc.pc.in.
set(prefix "${CMAKE_INSTALL_PREFIX}")
set(libdir "${MESHALLOC_PC_LIBDIR}")
set(includedir "${MESHALLOC_PC_INCLUDEDIR}")
set(version "${MESHALLOC_PC_VERSION}")
set(pc "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/${MESHALLOC_PC_LIBDIR}/pkgconfig/meshalloc.pc")
message(STATUS "Installing: ${pc}")
configure_file("${MESHALLOC_PC_TEMPLATE}" "${pc}" @ONLY)
list(APPEND CMAKE_INSTALL_MANIFEST_FILES "${pc}")
