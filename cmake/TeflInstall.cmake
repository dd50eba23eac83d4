# Install rules and the CMake / pkg-config packages for libtefl.
# Included at the end of the root CMakeLists.txt (after the `tefl` target).
#
#   <prefix>/include/tefl/*.h, *.hpp       public headers
#   <prefix>/<libdir>/libtefl.so*           the library
#   <prefix>/<libdir>/cmake/tefl/           find_package(tefl CONFIG) -> tefl::tefl
#   <prefix>/<libdir>/pkgconfig/tefl.pc     pkg-config (plugindir variable)
#   <prefix>/<libdir>/tefl/plugins/         plugins found without configuration
include(CMakePackageConfigHelpers)

set(TEFL_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/tefl" CACHE STRING
    "Where the tefl CMake package files are installed (relative to the prefix)")
set(TEFL_INSTALL_PLUGINDIR "${CMAKE_INSTALL_LIBDIR}/tefl/plugins")

# The plugin loader's built-in search directory, found at run time next to
# the libtefl that is loaded (dladdr), so that it follows the prefix actually
# installed to (`cmake --install <dir> --prefix P`, a relocated tree), not the
# one configured: <libdir>/tefl/plugins, where <libdir> holds libtefl.so. The
# Python wheel puts libtefl in the package directory, its plugins in
# `plugins` beside it. Defined on the loader's one source file only: a define
# on every source put a path into every compile command (ccache misses).
set(plugin_loader_source ${PROJECT_SOURCE_DIR}/src/core/plugin_loader.cpp)
if(SKBUILD)
  set_property(SOURCE ${plugin_loader_source} APPEND PROPERTY COMPILE_DEFINITIONS
               TEFL_PLUGIN_DIR_BESIDE_LIBRARY="plugins")
else()
  set_property(SOURCE ${plugin_loader_source} APPEND PROPERTY COMPILE_DEFINITIONS
               TEFL_PLUGIN_DIR_BESIDE_LIBRARY="tefl/plugins")
endif()

install(TARGETS tefl EXPORT teflTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT development
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tefl DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT development FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")
# The (empty) directory the loader searches for installed plugins.
install(DIRECTORY DESTINATION ${TEFL_INSTALL_PLUGINDIR} COMPONENT runtime)

# CMake package: find_package(tefl CONFIG) -> tefl::tefl (+ find_dependency(dlpack)).
install(EXPORT teflTargets NAMESPACE tefl:: FILE teflTargets.cmake
  DESTINATION ${TEFL_INSTALL_CMAKEDIR} COMPONENT development)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/teflConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/teflConfig.cmake
  INSTALL_DESTINATION ${TEFL_INSTALL_CMAKEDIR}
  PATH_VARS TEFL_INSTALL_PLUGINDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/teflConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/teflConfig.cmake ${PROJECT_BINARY_DIR}/cmake/teflConfigVersion.cmake
  DESTINATION ${TEFL_INSTALL_CMAKEDIR} COMPONENT development)

# pkg-config. Written at install time so that the paths in it follow the
# prefix actually installed to (`cmake --install <dir> --prefix P`), not the
# one configured.
foreach(_tefl_dir IN ITEMS LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_tefl_dir}}")
    set(TEFL_PC_${_tefl_dir} "${CMAKE_INSTALL_${_tefl_dir}}")
  else()
    set(TEFL_PC_${_tefl_dir} "\${prefix}/${CMAKE_INSTALL_${_tefl_dir}}")
  endif()
endforeach()
# First pass now (everything but the prefix), second pass at install time.
set(TEFL_PC_PREFIX "@TEFL_PC_PREFIX@")
configure_file(${CMAKE_CURRENT_LIST_DIR}/tefl.pc.in ${PROJECT_BINARY_DIR}/cmake/tefl.pc.in @ONLY)
install(CODE "
  set(TEFL_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${PROJECT_BINARY_DIR}/cmake/tefl.pc.in\" \"${PROJECT_BINARY_DIR}/cmake/tefl.pc\" @ONLY)
" COMPONENT development)
install(FILES ${PROJECT_BINARY_DIR}/cmake/tefl.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT development)
